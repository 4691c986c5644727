# jobs/: batch scripts, the demo and check scripts the README names
EXTRA_DIST += jobs/check.sh jobs/demo.sh jobs/cv.sh jobs/demo_plot.py jobs/bench/coll_vs_mpi.sh jobs/bench/dp_scaling.sh jobs/bench/sp_scaling.sh jobs/bench/bind.sh jobs/bench/pp_bubble.sh jobs/bench/local_sgd.sh jobs/bench/compress.sh jobs/bench/robustness.sh jobs/bench/augment_spatial.sh jobs/bench/compare_pytorch.sh jobs/bench/pytorch_step.py jobs/bench/plan_vs_step.sh jobs/bench/act_checkpoint.sh jobs/bench/zero_memory.sh jobs/bench/model_variants.sh jobs/bench/synthetic_task.sh jobs/bench/norm_candidates.py jobs/bench/precision.sh jobs/bench/plan_vs_cluster.sh jobs/bench/lost_node.sh jobs/bench/layout_auto.sh jobs/bench/peak_fraction.sh jobs/bench/compare_infer.sh jobs/bench/pytorch_infer.py jobs/elastic.sh jobs/gpu/check.sh jobs/gpu/pytorch_gpu.py jobs/gpu/nifti_check.py \
	jobs/slurm/train.sbatch jobs/slurm/infer.sbatch jobs/slurm/convert.sbatch jobs/slurm/sweep.sbatch jobs/slurm/selftest.sh \
	jobs/pbs/train.pbs jobs/pbs/infer.pbs jobs/pbs/convert.pbs jobs/pbs/sweep.pbs \
	jobs/scaling/sweep.sh jobs/scaling/report jobs/scaling/plot_plan \
	jobs/cluster/cluster.sh jobs/cluster/selftest.sh jobs/cluster/up jobs/cluster/down jobs/cluster/mpiexec jobs/cluster/on \
	jobs/cluster/link jobs/cluster/kill jobs/cluster/status jobs/cluster/slurm
