"""The rest of DeepSpeed 0.19.8's config keys: those of features zero_core lacks or does its own way.

Each list goes into config_keys.KEYS beside the rows of its section (the order of the docs table). What
DeepSpeed does with a key is its config classes' meaning (runtime/config.py, runtime/zero/config.py,
zero/offload_config.py, precision_config.py, compile/config.py, activation_checkpointing/config.py, ...).
"""

from __future__ import annotations

from .config_keys_base import REFUSED, SUPPORTED, Key, ignored

_Z = "zero_optimization."
_FP32 = "master weights, gradients and optimizer states are always fp32"
_KERNEL = "zero_core always runs its own fused Adam kernel"
_GONE = "DeepSpeed 0.19.8 removed it too; remove it"

TOP = [
    Key("managed_gradient_accumulation", REFUSED,
        "the engine steps at the accumulation boundary gradient_accumulation_steps sets", (True,)),
    *ignored("Python's garbage collector is left as it is", "disable_python_gc"),
    *ignored("updated weights are always all-gathered from the partitions", "disable_allgather"),
    *ignored("there is no sequence parallelism to communicate for", "seq_parallel_communication_data_type"),
    Key("sequence_parallel_size", REFUSED, "sequence parallelism is out of scope", (1,)),
    *ignored("the data-parallel size is the world size", "data_parallel_size"),
    Key("gradient_allreduce_op", REFUSED, "gradients are always averaged over the ranks", ("mean",)),
    Key("dataloader_drop_last", SUPPORTED),  # the DataLoader initialize builds from training_data
    *ignored("DeepSpeed's logger is not used", "log_level"),
    *ignored("DeepSpeed only warns when it is not a multiple of 8", "vocabulary_size"),
    *ignored("there are no expert-parallel groups (MoE is out of scope)", "use_data_before_expert_parallelism"),
]

OPTIMIZER = [
    *ignored(_KERNEL, "optimizer.legacy_fusion"),
    Key("optimizer.params.amsgrad", REFUSED, "the fused Adam kernels do not compute AMSGrad", (False,)),
    Key("optimizer.params.bias_correction", REFUSED, "the fused Adam kernels always correct the bias",
        (True,)),
    Key("optimizer.params.maximize", REFUSED, "the fused Adam kernels always minimize", (False,)),
    Key("optimizer.params.fp32_optimizer_states", REFUSED, _FP32, (True, None)),
    *ignored(_KERNEL, *(f"optimizer.params.{k}" for k in ("fused", "foreach", "capturable", "differentiable"))),
    *ignored("gradients live in zero_core's own buffers", "optimizer.params.set_grad_none"),
]

PRECISION = [
    Key("fp16.fp16_master_weights_and_grads", REFUSED, _FP32, (False,)),
    *ignored("each micro-batch's gradients are added into the sums (data_types.grad_accum_dtype) as they arrive "
             "either way", "bf16.immediate_grad_update"),
    Key("bf16.check_grad_overflow", REFUSED, "a step whose gradients are not finite is always skipped", (True,)),
    Key("bf16.bf16_master_weights_and_grads", REFUSED, _FP32, (False,)),
    Key("bf16.bf16_optimizer_states", REFUSED, _FP32, (False,)),
]

ZERO = [
    *ignored("stages 1-3 always reduce-scatter the gradient buckets", _Z + "use_multi_rank_bucket_allreduce"),
    *ignored("the gradient norm is always computed (false is refused outside stages 1-2, as DeepSpeed refuses it)",
             _Z + "compute_grad_norm"),
    Key(_Z + "load_from_fp32_weights", REFUSED, "checkpoints always restore the fp32 master weights", (True,)),
    *ignored("zbench checkpoints always reshard on load", _Z + "elastic_checkpoint"),
    Key(_Z + "zenflow", REFUSED, "ZenFlow is not implemented", (None,)),
    *ignored("pinning follows zero_core's own rules (offload_*.pin_memory)", _Z + "cpu_offload_use_pin_memory"),
    *ignored("stage3_param_persistence_threshold alone decides what stays gathered",
             _Z + "stage3_model_persistence_threshold"),
    *ignored("stage 3 gathers and releases whole units, not single modules", _Z + "stage3_module_granularity_threshold",
             _Z + "stage3_allgather_sequential", _Z + "leaf_module"),
    *ignored("stage 3 fetches parameters with all-gathers", _Z + "stage3_use_all_reduce_for_fetch_params"),
    *ignored("a parameter without a gradient does not stop training, as with DeepSpeed's default",
             _Z + "ignore_unused_parameters"),
    *ignored("zero_core has one implementation of each stage", _Z + "legacy_stage1"),
    *ignored("zero_core's flat buffers have a layout of their own", _Z + "parameter_alignment"),
    Key(_Z + "zero_hpz_partition_size", REFUSED,
        "weights are gathered from all ranks, with no ZeRO++ hpZ secondary partition", (1, 0)),
    Key(_Z + "zero_quantized_weights", REFUSED,
        "weights are all-gathered unquantized (no ZeRO++ qwZ)", (False,)),
    Key(_Z + "zero_quantized_nontrainable_weights", REFUSED,
        "frozen weights are kept in the working precision, never quantized", (False,)),
    Key(_Z + "zero_quantized_gradients", REFUSED,
        "gradients are reduced unquantized (no ZeRO++ qgZ)", (False,)),
    *ignored("stage 3 runs torch's own linear layers", _Z + "memory_efficient_linear"),
    *ignored("there is no pipeline parallelism", _Z + "pipeline_loading_checkpoint"),
    *ignored("zero_core does not replace nn.Module.apply", _Z + "override_module_apply"),
    *ignored("no extra checks or warnings are printed", _Z + "log_trace_cache_warnings", _Z + "enable_sanity_checks"),
    *ignored("Muon is not among zero_core's optimizers", _Z + "save_muon_momentum_buffer_in_memory"),
]

OFFLOAD_OPTIMIZER = [
    *ignored("NVMe offload reads the next chunk while one is updated", _Z + "offload_optimizer.pipeline_read",
             _Z + "offload_optimizer.pipeline_write"),
    *ignored("the host update is zero_core's own, on its own threads", _Z + "offload_optimizer.super_offload",
             _Z + "offload_optimizer.cpuadam_cores_perc"),
]

CHECKPOINT = [
    *ignored("there are no pipeline stages", "checkpoint.parallel_write"),
    *ignored("checkpoints are written in zbench's own format", "checkpoint.checkpoint_serialization",
             "checkpoint.writer"),
]

_COMPILE = ("free_activation", "free_activation_threshold", "offload_activation", "offload_activation_pin_memory",
            "offload_opt_states", "double_buffer", "symmetric_memory", "debug_log", "offload_parameters",
            "sync_before_reduce", "sync_after_reduce", "sync_before_allgather", "sync_after_allgather",
            "keep_int_input_tensors", "keep_all_input_tensors")
_HYBRID = ("max_out_tokens", "inference_tp_size", "release_inference_cache", "pin_parameters",
           "tp_gather_partition_size", "enable_cuda_graph")
_RECOMPUTE = "deepspeed.checkpointing recomputes through torch.utils.checkpoint"

SECTIONS = [
    Key("torch_autocast.enabled", REFUSED, "the model runs in the precision fp16 or bf16 enables, without autocast",
        (False,)),
    *ignored("autocast is off", "torch_autocast.dtype", "torch_autocast.lower_precision_safe_modules"),
    Key("hybrid_engine.enabled", REFUSED, "DeepSpeed-Chat's hybrid engine (inference kernels for "
        "generation) is not implemented", (False,)),
    *ignored("the hybrid engine is off", *(f"hybrid_engine.{k}" for k in _HYBRID)),
    Key("compile.deepcompile", REFUSED, "DeepCompile is not implemented", (False,)),
    Key("compile.autoep_non_moe", REFUSED, "AutoEP is not implemented", (False,)),
    Key("compile.passes", REFUSED, "DeepCompile is not implemented", (None,)),
    *ignored("DeepCompile is off", *(f"compile.{k}" for k in _COMPILE)),
    *ignored("no model parallelism: DeepSpeed partitions activations over a model-parallel group, which is one rank "
             "here, so it changes nothing", "activation_checkpointing.partition_activations"),
    Key("activation_checkpointing.cpu_checkpointing", SUPPORTED, "read by deepspeed.checkpointing.configure("
        "deepspeed_config=...), as DeepSpeed's: each checkpoint's tensor arguments wait for backward on the host"),
    *ignored(_RECOMPUTE, *(f"activation_checkpointing.{k}" for k in (
        "contiguous_memory_optimization", "number_checkpoints", "synchronize_checkpoint_boundary", "profile"))),
    Key("data_types.grad_accum_dtype", SUPPORTED),  # config_models.grad_accum_dtype; a 16-bit mix is refused
    *ignored("parameters run in the precision fp16 or bf16 enables (it must name that one)", "data_types.param_dtype"),
    Key("data_types.buffer_dtype", SUPPORTED),  # buffer_dtypes.py: every floating buffer cast to it
    Key("data_types.keep_in_fp32_modules", SUPPORTED),  # buffer_dtypes.py: these buffers stay in fp32
    *ignored("only a PipelineModule reads it, and deepspeed.pipe is not in zero_core", "pipeline"),
    *ignored("DeepSpeed's throughput timer is not kept (wall_clock_breakdown prints the phase times)", "timers"),
    Key("autotuning", REFUSED, "autotuning is not implemented; run zbench scenarios to tune", (False,), "enabled"),
    Key("data_efficiency", REFUSED, "curriculum learning and data routing are out of scope", (False,), "enabled"),
    Key("expert_parallel", REFUSED, "expert parallelism (AutoEP) is out of scope", (False,), "enabled"),
    Key("tensor_parallel", REFUSED, "tensor parallelism (AutoTP) is out of scope", (0, 1), "autotp_size"),
    Key("datastates_ckpt", REFUSED, "checkpoints are written in zbench's own format", (False,)),
]

REFUSED_OUTRIGHT = [
    Key("weight_quantization", REFUSED, "weight quantization is out of scope; remove it"),
    *(Key(k, REFUSED, _GONE) for k in ("sparse_attention", "sparse_gradients", "compression_training",
                                       "curriculum_learning", "quantize_training", "nebula", "eigenvalue",
                                       "graph_harvesting", "progressive_layer_drop")),
    *(Key(_Z + k, REFUSED, _GONE) for k in ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")),
    Key("gradient_accumulation_dtype", REFUSED, "it is not a DeepSpeed key (DeepSpeed skips it unread); the "
        "accumulation dtype is data_types.grad_accum_dtype"),
]
