/* The 3D U-Net of docs/engine.md: encoder levels enc0..enc{L-1} of two
 * (3x3x3 conv with bias -> norm -> ReLU) blocks with 2x max-pool between
 * them, decoder levels dec{L-2}..dec0 each after a 2x2x2 stride-2
 * transposed conv up{l} and the channel concatenation [upsampled, skip], a
 * 1x1x1 head giving K class scores. Parameters live in one ts_arena under
 * PyTorch's state_dict names; activations are channels-last and owned by
 * the model (allocated for one input shape by ts_unet_setup). All calls are
 * local (one rank; with a spatial split the hooks it is given communicate);
 * threads come from OpenMP. */
#ifndef TS_MODEL_UNET_H
#define TS_MODEL_UNET_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/config.h"
#include "src/core/tensor.h"
#include "src/model/arena.h"
#include "src/nn/layers.h"

#define TS_UNET_MAX_LEVELS 8
#define TS_UNET_MAX_RES_BLOCKS 8 /* model.res_blocks: residual blocks per encoder level */

typedef enum { TS_NORM_BATCH = 0, TS_NORM_GROUP, TS_NORM_INSTANCE } ts_norm_kind;
typedef enum { TS_ARCH_UNET = 0, TS_ARCH_RESENC } ts_arch;
typedef enum { TS_ACT_RELU = 0, TS_ACT_LEAKY } ts_act_kind;
typedef enum { TS_LOSS_CE = 1, TS_LOSS_DICE = 2, TS_LOSS_CE_DICE = 3 } ts_loss_kind;
/* train.engine: where the layers run. AUTO is resolved by
 * ts_unet_engine_choose; a model created with AUTO unresolved runs on the CPU. */
typedef enum { TS_ENGINE_CPU = 0, TS_ENGINE_CUDA, TS_ENGINE_AUTO } ts_engine;

typedef struct ts_unet_cfg {
    int levels;
    int channels[TS_UNET_MAX_LEVELS];
    int in_channels, classes;
    ts_norm_kind norm;
    int groups;       /* group norm */
    float eps;        /* norm epsilon */
    float momentum;   /* batch-norm running-statistics momentum */
    ts_loss_kind loss;
    int ignore_index; /* -1: none */
    int weighted;     /* class_weights set */
    float class_weights[256];
    int64_t patch[3]; /* data.patch (D, H, W) */
    ts_precision precision; /* train.precision: the convolutions' (set by forward and backward) */
    unsigned ckpt_levels; /* model.checkpoint_levels: bit l set = level l is recomputed in backward */
    ts_arch arch;         /* model.arch: plain encoder, or residual encoder (docs/engine.md) */
    int res_blocks[TS_UNET_MAX_LEVELS]; /* resenc: residual blocks of encoder level l (1..8) */
    int deep_supervision; /* model.deep_supervision: auxiliary heads ds1..ds{L-3}, weighted losses */
    ts_act_kind act;      /* model.act: ReLU or leaky ReLU after each norm */
    float slope;          /* model.leaky_slope (leaky ReLU) */
    ts_engine engine;     /* train.engine (docs/gpu.md) */
    int tf32;             /* train.tf32: fp32 convolutions on a GPU may use TF32 (set by forward and backward) */
    int conv_winograd;    /* train.conv = winograd: ts_nn_set_winograd in every forward and backward (CPU) */
} ts_unet_cfg;

/* Config keys of the model (model.*, data.patch, train.loss, train.ignore_index,
 * train.class_weights, train.batch, train.seed, train.precision, train.engine); NULL-terminated. */
extern const ts_cfg_key ts_model_config_keys[];

/* Local (opens the GPU where it picks one). Resolves u->engine on the
 * rank with node-local rank local_rank: AUTO becomes CUDA where a GPU is
 * found (the GPU engine runs every architecture, pipeline and split), else
 * CPU; note (n bytes) says which GPU it took ("" with no GPU: `tessera
 * info` says why); CUDA without a GPU is TS_ERR_CONFIG naming
 * train.engine and the reason. On CUDA, opens GPU local_rank % count. */
int ts_unet_engine_choose(ts_unet_cfg *u, int local_rank, char *note, size_t n);
/* Local. "cpu" or "cuda" (the engine a model runs on). */
const char *ts_unet_engine_name(ts_engine e);

/* Local. Reads and validates the model keys; errors name the key (channels
 * not divisible by model.groups, patch edges not divisible by 2^(levels-1),
 * class weights count != classes ...). */
int ts_unet_cfg_from_config(const ts_config *cfg, ts_unet_cfg *u);
/* The loss weight of the decoder output at level l (0 = full resolution) as
 * nnU-Net weighs deep supervision: 1/2^l for l = 0 .. levels-2, the lowest
 * (levels-2) set to 0, normalised to sum 1. Without deep supervision 1 for
 * level 0 and 0 otherwise. */
double ts_unet_ds_weight(const ts_unet_cfg *u, int l);
/* Local. Whether the model is the plain UNet3D (model.arch = unet without
 * model.deep_supervision; any norm and activation): the model that
 * activation checkpointing and bf16/fp16 support (spatial splits and
 * pipeline stages take every model). */
int ts_unet_is_plain(const ts_unet_cfg *u);
/* Local. Parses a model.checkpoint_levels value ("none", "all", or a comma
 * list of levels 0 .. levels-1, level 0 being full resolution) into a bit
 * mask; errors (TS_ERR_CONFIG) name the key, where the value came from
 * (src) and the valid levels. */
int ts_unet_parse_checkpoint_levels(const char *s, int levels, const char *src, unsigned *mask);
/* Local. Writes the levels of mask as "0,1" ("none" for 0) into buf. */
const char *ts_unet_checkpoint_str(unsigned mask, char *buf, size_t n);
/* Local. Checks that a D x H x W input suits the network (each edge divisible
 * by 2^(levels-1)); what names the source in the message. */
int ts_unet_check_input(const ts_unet_cfg *u, const int64_t dhw[3], const char *what);

typedef struct ts_unet ts_unet;
typedef struct ts_unet_split ts_unet_split; /* below */

/* Local. Builds the parameter table and allocates the arena with nstate
 * optimizer state regions (ts_optim_state_count). Parameters start at zero:
 * call ts_unet_init or load weights. */
int ts_unet_create(const ts_unet_cfg *cfg, int nstate, ts_unet **out);
void ts_unet_destroy(ts_unet **m);
/* Local. A second model of m's configuration with a copy of its parameters
 * and buffers and its Winograd and folding choices, for forwards that run
 * at the same time as m's on other threads (tessera infer's streams=;
 * the two share nothing). Only a whole model on the CPU without a split:
 * TS_ERR_UNSUPPORTED otherwise. */
int ts_unet_clone(ts_unet *m, ts_unet **out);
ts_arena *ts_unet_arena(ts_unet *m);
const ts_unet_cfg *ts_unet_config(const ts_unet *m);

/* Local. PyTorch's default initialisation: conv and transposed-conv weights
 * Kaiming-uniform(a = sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)); norm weight 1, bias 0; running mean 0,
 * var 1. Random numbers from Philox stream (seed, 0, parameter index). */
int ts_unet_init(ts_unet *m, uint64_t seed);

/* Local. Allocates activations and gradient buffers for inputs of n samples
 * of d x h x w (no-op if already set up for that shape). */
int ts_unet_setup(ts_unet *m, int n, int d, int h, int w);
/* Bytes of activation and gradient buffers held by the model (every slot,
 * the shared backward buffers and the halo faces). */
size_t ts_unet_activation_bytes(const ts_unet *m);
/* Bytes of one slot: one micro-batch's activations kept for backward (no
 * halo faces, no shared backward buffers, no recompute scratch). */
size_t ts_unet_slot_bytes(const ts_unet *m);
/* Bytes of the recompute scratch (included in ts_unet_activation_bytes):
 * one checkpointed level's buffers, shared by all checkpointed levels and
 * slots; 0 without activation checkpointing. */
size_t ts_unet_recompute_bytes(const ts_unet *m);
/* Local. The bytes ts_unet_setup(m, n, d, h, w) would allocate (with the
 * split set now), without allocating: the memory plan checked against
 * run.mem_limit_mb before any work. */
int ts_unet_plan_bytes(ts_unet *m, int n, int d, int h, int w, size_t *bytes);
/* Local. The same for another split (NULL: none), e.g. to find the
 * parallel.sp that fits a memory limit; the model's own split and buffers
 * are untouched. */
int ts_unet_plan_bytes_split(ts_unet *m, const ts_unet_split *split, int n, int d, int h, int w, size_t *bytes);

/* Local (with a split or a norm sync hook: collective over the group
 * through the hooks, every rank making the same calls in the same order; a
 * rank that fails alone leaves the others waiting in the hooks). Forward
 * pass on image [N, C, D, H, W] (float32, PyTorch layout); train = 1 uses
 * batch statistics (and updates running statistics), train = 0 the running
 * statistics. */
int ts_unet_forward(ts_unet *m, const ts_tensor *image, int train);
/* Local. The logits of the last forward, channels-last [N, D, H, W, K],
 * in host memory (on the GPU engine copied from the device by this call);
 * NULL when that copy failed (the error is recorded: ts_err_last). */
const ts_tensor *ts_unet_logits(ts_unet *m);
/* Local (collective through the split's sums, as forward). Loss of the
 * last forward against labels [N, D, H, W] (uint8); with_grad = 1 also
 * stores dloss/dlogits for ts_unet_backward. */
int ts_unet_loss(ts_unet *m, const ts_tensor *labels, int with_grad, double *loss);
/* ---- pipeline stages ----
 * The network is a sequence of 4L - 1 layer units, one per convolution
 * with what comes before it, and the head: enc0.conv1, enc0.conv2,
 * enc1.conv1 (with the max-pool before it), ..., enc{L-1}.conv2,
 * dec{L-2}.conv1 (with up{L-2} and the concatenation with the skip),
 * dec{L-2}.conv2, ..., dec0.conv2, head (with the loss). The residual
 * encoder's level l is two units too: enc l.conv1 holds the stem (l = 0)
 * and the residual blocks but the last, enc l.conv2 the last block (so
 * with one block at l > 0, enc l.conv1 is empty and the block reads enc
 * l-1's output directly). A deep supervision head ds{l} belongs to dec
 * l.conv2; its logits travel to the head's unit, where every loss term is
 * computed (edge DS), and their gradient back. A stage holds the
 * units [u0, u1) and activations for `slots` micro-batches in flight; its
 * parameters are the arena entries of its units (ts_unet_unit_params:
 * contiguous, in unit order). Tensors cross between units along edges: a
 * block's first conv's output to its second (BLOCK), enc l's output to enc
 * l+1 (pooled) and to dec l (the skip), dec l+1's (or enc{L-1}'s) output to
 * up{l}, dec0's (or enc0's when L = 1) to the head. For an edge crossing the
 * stage's border the caller moves the activation from the producer's stage
 * into the consumer's receive buffer before the consumer's forward, and
 * the gradient back from the consumer's buffer into the producer's before
 * the producer's backward (ts_unet_edge_tensors). For the residual
 * encoder the POOL edge of level l goes to the unit holding level l+1's
 * first block (the strided conv), and BLOCK carries the output of the
 * level's last block but one (the stem's at level 0 with one block). */
typedef enum { TS_EDGE_POOL = 0, TS_EDGE_SKIP, TS_EDGE_UP, TS_EDGE_HEAD, TS_EDGE_BLOCK, TS_EDGE_DS } ts_edge_kind;
typedef struct ts_unet_edge {
    int tensor;             /* enc l's output l, dec l's L + l; between their units 2L + l, 3L + l; */
                            /* ds{l}'s logits 4L + l */
    int producer, consumer; /* units */
    ts_edge_kind kind;
} ts_unet_edge;
/* Local. Number of units (4L - 1), their names ("enc0.conv1", "dec1.conv2",
 * "head"), the arena entries [first, end) of unit u. */
int ts_unet_units(const ts_unet *m);
const char *ts_unet_unit_name(const ts_unet *m, int u, char *buf, size_t n);
void ts_unet_unit_params(const ts_unet *m, int u, int *first, int *end);
/* Local. Every edge of the network into e (room for TS_UNET_MAX_EDGES); returns the count. */
#define TS_UNET_MAX_EDGES (6 * TS_UNET_MAX_LEVELS)
int ts_unet_edges(const ts_unet *m, ts_unet_edge *e);
/* Local. Makes this model the stage [u0, u1) with `slots` activation slots
 * (frees the activations; the default is every unit, 1 slot). */
int ts_unet_set_stage(ts_unet *m, int u0, int u1, int slots);
void ts_unet_stage(const ts_unet *m, int *u0, int *u1, int *slots);
/* Local. For an edge touching this stage: *act the tensor's activation in
 * slot k (the producer's output, or the consumer's receive buffer), *grad
 * the consumer's gradient with respect to it (written by the consumer's
 * backward, or for DS edges by the loss, read by the producer's backward;
 * shared by the slots, except the DS logits' gradient, slot k's). Needs
 * setup. */
int ts_unet_edge_tensors(ts_unet *m, int k, const ts_unet_edge *e, ts_tensor **act, ts_tensor **grad);
/* Forward, loss and backward of the stage's units on slot k (the calls
 * above work on slot 0). image is used by the stage holding enc0 (and sets
 * up the activations for its shape; other stages call ts_unet_setup);
 * loss belongs to the stage holding the head. */
int ts_unet_forward_slot(ts_unet *m, int k, const ts_tensor *image, int train);
int ts_unet_loss_slot(ts_unet *m, int k, const ts_tensor *labels, int with_grad, double *loss);
int ts_unet_backward_slot(ts_unet *m, int k);
const ts_tensor *ts_unet_logits_slot(ts_unet *m, int k);

/* Wall time spent per kind of layer since ts_unet_create or the last reset
 * (forward and backward; for profiles such as `bench step --profile`). */
typedef enum {
    TS_PROF_CONV_FWD = 0, TS_PROF_CONV_WGRAD, TS_PROF_CONV_DGRAD, TS_PROF_CONVT, TS_PROF_NORM, TS_PROF_POOL,
    TS_PROF_LOSS, TS_PROF_HALO, TS_PROF_OTHER, TS_PROF_COUNT
} ts_unet_prof;
/* Local. The name of a kind ("conv fwd", ...); a static string. */
const char *ts_unet_prof_name(int kind);
/* Local. Seconds per kind (TS_PROF_COUNT values), owned by the model. */
const double *ts_unet_profile(const ts_unet *m);
/* Local. Zeroes the seconds. */
void ts_unet_profile_reset(ts_unet *m);
/* Local. On the GPU engine, on (1) makes each profiled layer call wait for
 * the device before its time is taken, so the seconds per kind are the
 * GPU's and not the queueing's (slower: one synchronisation per layer).
 * No effect on the CPU engine. */
void ts_unet_set_profile_sync(ts_unet *m, int on);

/* Local. fn (may be NULL) is called during ts_unet_backward(_slot) with the arena
 * index of each parameter as soon as its gradient is final, so a
 * data-parallel caller can reduce gradient buckets while backward goes on. */
void ts_unet_set_grad_hook(ts_unet *m, void (*fn)(void *ctx, int param), void *ctx);
/* Local. fn (may be NULL) is called after each unit of a forward or
 * backward (backward = 1) has finished (to send what it produced at once,
 * and to progress messages in flight). */
void ts_unet_set_unit_hook(ts_unet *m, void (*fn)(void *ctx, int unit, int backward), void *ctx);
/* Local. fn (may be NULL) makes batch norm synchronised: it must sum n
 * doubles over the ranks sharing the statistics (in the same order on every
 * rank); forward uses the group's statistics, backward the group's sums for
 * the input gradient (PyTorch SyncBatchNorm). */
void ts_unet_set_norm_sync(ts_unet *m, ts_nn_sync_fn fn, void *ctx);
/* Local. on = 1: an eval-mode forward (train = 0) of a model with batch
 * norm on the CPU folds each conv block's norm (its running statistics)
 * and activation into the convolution's epilogue (ts_conv_ep): the same
 * logits, bit for bit, without the separate norm and activation passes;
 * the pre-norm activations are not kept, so a backward after such a
 * forward is refused. For inference (ts_eval_predict sets it); off by
 * default. */
void ts_unet_set_fold_eval(ts_unet *m, int on);
/* Local. on = 1: eval-mode forwards (train = 0) on the CPU run with
 * ts_nn_set_winograd on (fp32 3x3x3 convolutions with at least 16 input and
 * 16 output channels as Winograd F(2x2x2, 3x3x3) ones, without a spatial
 * split): logits within about 1e-6 of the direct convolutions', not the
 * same bits. tessera infer sets it (conv=winograd, its default); off by
 * default. train.conv = winograd turns it on for every forward and
 * backward. */
void ts_unet_set_winograd(ts_unet *m, int on);

/* A spatial split of the model's inputs (spatial parallelism): this rank
 * holds one box of every input and so of every activation (halved per
 * level); 3x3x3 convolutions exchange one-voxel halos with the neighbours
 * (the interior is computed while they travel, the border after; the
 * residual encoder's stride-2 convs use the input's low side in forward
 * and the output gradient's high side in backward), 1x1x1 convolutions
 * (heads, strided skips) and deep supervision's labels stay in the box, group
 * and instance norm and the losses sum their statistics over the group,
 * batch norm uses the ts_unet_set_norm_sync hook if set (which must span at
 * least the group), else the group's sums. The hooks reach the other ranks
 * (src/parallel's ts_spatial, wired by the caller: the model has no MPI). */
struct ts_unet_split {
    int on[3];     /* dims split over the group (halos along them) */
    int nbr[3][2]; /* 1 where a neighbour holds the next box along dim d, lower (0) / upper (1) side */
    int (*halo_start)(void *ctx, const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3],
                      const ts_halo *h);
    /* the same for a box packed already (the GPU engine: ts_halo_pack on the device, copied down), C channels
     * in ts_halo_send_floats's layout for the offsets of send_mask */
    int (*halo_start_packed)(void *ctx, const float *packed, int C, int N, const int64_t dhw[3], const ts_halo *h);
    unsigned send_mask;
    void (*halo_progress)(void *ctx);
    int (*halo_wait)(void *ctx);
    ts_nn_sync_fn reduce; /* sum or max over the group, same order on every rank (src/nn/layers.h) */
    void *ctx;
};
/* ---- activation checkpointing (model.checkpoint_levels) ----
 * Level l (0 = full resolution) means the encoder block enc l (with the
 * max-pool before it) and the decoder block dec l (with up{l} before it):
 * the layer units enc l.conv1, enc l.conv2, dec l.conv1, dec l.conv2. Such
 * a level keeps per slot only what its blocks' outputs and inputs need:
 * the block outputs (enc l's is the skip and the next level's input, dec
 * l's the next block's input), the image (level 0), the norms' saved
 * statistics and the conv input halos. The max-pool output and indices,
 * up{l}'s output, both conv outputs and the first norm's output live in
 * one shared recompute scratch (sized for the largest checkpointed level,
 * reused by every checkpointed level and slot). Backward recomputes them
 * from the kept inputs with the same kernels in the same order (split
 * halos exchanged and norm statistics summed again, running statistics
 * left alone): gradients are bit-identical to no checkpointing. A block's
 * first norm output that leaves a pipeline stage (a cut between the two
 * convs) stays in the slot. Local; frees the activations (call before
 * ts_unet_setup). Errors: a level outside 0 .. levels-1 (TS_ERR_ARG). */
int ts_unet_set_checkpoint(ts_unet *m, unsigned levels);
unsigned ts_unet_checkpoint(const ts_unet *m);

/* Local. Sets the split (NULL: none); frees the activations, so call it
 * before ts_unet_setup, whose shape is then the box's. */
void ts_unet_set_split(ts_unet *m, const ts_unet_split *s);
/* Local. The loss gradient is multiplied by f (default 1): a spatially
 * split data-parallel step averages gradients over dp x sp ranks whose
 * shares of one sample must add up, so it scales by sp. */
void ts_unet_set_loss_scale(ts_unet *m, float f);
/* Local. The precision of the model's convolutions (default: the config's
 * train.precision): forward and backward set the process-wide
 * ts_nn_set_conv_precision to it when they start. */
void ts_unet_set_precision(ts_unet *m, ts_precision p);
/* Bytes of halo face buffers held (included in ts_unet_activation_bytes). */
size_t ts_unet_halo_bytes(const ts_unet *m);

/* Local (collective through the hooks, as forward). Backward from the
 * stored logit gradient, accumulating parameter
 * gradients into the arena (call ts_arena_zero_grad first). Needs a train-mode
 * forward and ts_unet_loss(with_grad = 1) on the same input. */
int ts_unet_backward(ts_unet *m);

#endif
