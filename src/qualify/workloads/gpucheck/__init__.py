"""The GPU check (scripts/gpu-check.sh): the training workload's throughput on one GPU beside a bare PyTorch
loop of the same model, within a time budget. `harness` drives the runs (each its own process, stopped with
the workloads' process-group killer); `bare_loop` is the loop without DeepSpeed or qualify."""
