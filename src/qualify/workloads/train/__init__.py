"""Training-throughput workload: `python -m qualify.workloads.train --case CASE.json`.

Trains a decoder LM (a preset architecture with random weights, or a HF config.json)
through DeepSpeed for warm-up + repeats x steps optimizer steps and reports
throughput, step-time spread, model TFLOP/s per device, MFU, memory and loss as one
result document (qualify.workloads.protocol). Runs inside the candidate image:
standard library, torch, deepspeed and transformers only.

`python -m qualify.workloads.train --describe PRESET --seq-len T` prints the
parameter counts and model FLOPs per token (meta device, nothing allocated).

Choices:
- The optimizer is a plain torch.optim.AdamW handed to deepspeed.initialize, so no
  DeepSpeed op (CPUAdam/FusedAdam) has to be compiled; a deepspeed_config with its
  own "optimizer" section is honoured instead. On CPU DeepSpeed still builds its shm
  comm op once (cached under TORCH_EXTENSIONS_DIR).
- compile=true wraps the model in torch.compile before deepspeed.initialize (what
  the HF Trainer does); the first step's extra time is compile_time_s.
- Activation checkpointing uses transformers' per-layer checkpointing (non-reentrant).
- Evidence, not flags (issue 11), in the environment: compile_graphs and
  compile_graph_breaks (torch._dynamo counters over the engine's steps; "compiled" is true
  only when a graph was compiled, "compile_wrapped" says the module is wrapped),
  checkpointed_layers (decoder layers that called their checkpoint function during the
  timed steps; checkpointing_enabled_layers is what was asked of transformers) and
  activation_memory_bytes of the timed engine (one more step after the timed repeats:
  allocator delta over the forward on CUDA, bytes saved for backward on CPU). The metric
  activation_saved_bytes (eager model, before DeepSpeed) stays as the structural figure.
- Measurement: threads set with torch.set_num_threads (default: every core this process
  may use, shared by the ranks of a node), warm-up steps, then repeats x steps timed
  optimizer steps with cyclic GC paused inside a repeat; medians and spread reported.
  On a shared 2-core machine num_threads=1 is far steadier (benchmarks/train_noise.py).
- peak_memory_bytes: the training peak, measured from after warm-up (CUDA peak stats
  reset; on CPU the peak RSS VmHWM reset through /proc/self/clear_refs): CUDA max
  allocated on a GPU, peak RSS on CPU (environment.memory_measure says which);
  setup_peak_memory_bytes is the peak before that (model, eager pass,
  deepspeed.initialize, warm-up, compile).
- MFU: the peak of (device, dtype) from train/mfu.py, or the case's peak_flops_per_device
  (peak_source "manifest" or "table:<device>/<dtype>"); null with mfu_null_reason otherwise.
- Several ranks: each writes its own document (ranks.py) and the parent merges them.
"""
