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
- Activation checkpointing uses transformers' per-layer checkpointing (non-reentrant);
  the environment reports how many layers really checkpoint, and the metric
  activation_saved_bytes (bytes autograd keeps after one micro-batch forward) shows its
  memory effect without depending on the allocator.
- Measurement: threads set with torch.set_num_threads (default: every core this process
  may use, shared by the ranks of a node), warm-up steps, then repeats x steps timed
  optimizer steps with cyclic GC paused inside a repeat; medians and spread reported.
  On a shared 2-core machine num_threads=1 is far steadier (benchmarks/train_noise.py).
- peak_memory_bytes: CUDA max allocated on a GPU, the process's peak RSS on CPU
  (environment.memory_measure says which).
"""
