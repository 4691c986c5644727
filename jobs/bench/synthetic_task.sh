# Sourced by the convergence benchmarks (jobs/bench/local_sgd.sh,
# compress.sh, precision.sh): the synthetic segmentation task they share, so
# that their figures compare. synthetic_task DIR STEPS writes DIR/syn.h5
# (16 tessera synth phantoms of 24^3, 3 classes, seed 11) and DIR/task.ini
# (a 3-level UNet3D of 4,8,16 channels with group norm, 16^3 patches, batch 2
# per rank, SGD lr 0.05 momentum 0.9, ce+dice, a log line every step, no
# checkpoints, no final evaluation). Needs $tessera.
synthetic_task() {
    local dir=$1 steps=$2
    mpiexec.mpich -n 2 "$tessera" synth --out "$dir/syn.h5" --count 16 --size 24 --classes 3 --seed 11 >/dev/null
    cat >"$dir/task.ini" <<INI
[model]
channels = 4,8,16
classes = 3
norm = group
groups = 2
[data]
patch = 16
[train]
batch = 2
steps = $steps
lr = 0.05
momentum = 0.9
loss = ce+dice
log_every = 1
[ckpt]
every = 0
every_minutes = 0
[eval]
final = false
INI
}
