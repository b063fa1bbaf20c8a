"""Inference-quantization workload: ``python -m qualify.workloads.infer --case CASE.json``.

Runs one case (a model, a quantization scheme, an engine) and prints one result document
(protocol.run_workload). Layout:

* params.py   - the case parameters, schemes and probes (standard library; the orchestrator's
                manifest imports the scheme and probe names from here)
* runner.py   - the case handler and the verdict (judge)
* engines/    - the engines by name (engines/__init__.py is the registry): hf.py
                (transformers + torchao, CPU or CUDA) and vllm_adapter.py (vLLM, GPU images only)
* models.py, corpus.py, quant.py, metrics.py, probes.py - what the engines share

Runs inside the candidate image: standard library, torch, transformers, torchao, vllm
(lazily, only in the vllm engine) and qualify.workloads only.
"""
