"""Models for the inference workload: tiny CPU presets, real names, model directories.

Tiny presets are small configs of the release's model families (Qwen3, Llama 3,
Qwen3-MoE for the MoE path). They have no published weights, so they are trained
briefly on the seed's synthetic language (corpus.MarkovLanguage) and cached on
disk under $QUALIFY_CACHE_DIR/infer (default ~/.cache/qualify/infer), keyed by preset,
seed, steps and corpus version; a cached directory is an ordinary Hugging Face model
directory (save_pretrained) plus qualify-preset.json, so it also loads as a path.

Standard library, torch, transformers and qualify.workloads only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from qualify.workloads.infer.corpus import (CORPUS_VERSION, STREAM_EVAL, STREAM_PROBES, STREAM_PROMPTS,
                                            STREAM_TRAIN, MarkovLanguage, eval_text_facts, eval_window_starts,
                                            region_starts, seeded_generator, take, text_token_stream)
from qualify.workloads.infer.catalog import REAL_MODELS, TINY_PRESETS  # noqa: F401 - re-exported
from qualify.workloads.protocol import BadCase
from qualify.workloads.settings import WorkloadSettings

PRESET_META = "qualify-preset.json"

# The model tables live in catalog.py (standard library only: the manifest validates names with them).


# Training recipe of the tiny presets (part of the cache key through CORPUS_VERSION). 120
# steps of 16 x 64 tokens bring the loss within ~0.06 nats of the language's entropy.
TRAIN_BATCH = 16
TRAIN_SEQ = 64
TRAIN_LR = 1e-2


@dataclasses.dataclass(frozen=True)
class ModelSource:
    kind: str  # "preset" | "path" | "hub"
    name: str
    path: str | None = None
    preset: str | None = None


def resolve_model(name: str, engine: str, param: str = "model") -> ModelSource:
    if name in TINY_PRESETS:
        return ModelSource("preset", name, preset=name)
    if os.path.isdir(name):
        return ModelSource("path", name, path=os.path.abspath(name))
    if name in REAL_MODELS:
        base = WorkloadSettings.from_env().models_dir
        if base and os.path.isdir(os.path.join(base, name)):
            return ModelSource("path", name, path=os.path.join(base, name))
        if engine == "vllm":
            return ModelSource("hub", name, path=REAL_MODELS[name])
        raise BadCase(f"{param}: {name!r} is a real model with no weights here: give a model directory "
                      f"or put it under $QUALIFY_MODELS_DIR/{name}")
    if engine == "vllm" and "/" in name and not name.startswith((".", "/")):
        return ModelSource("hub", name, path=name)  # a hub id, resolved by vLLM itself
    raise BadCase(f"{param}: {name!r} is neither a preset ({', '.join(TINY_PRESETS)}), "
                  f"a real model ({', '.join(REAL_MODELS)}) nor a model directory")


def cache_root() -> Path:
    return Path(WorkloadSettings.from_env().cache_dir) / "infer"


def preset_config(preset: str):
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    family, kwargs = TINY_PRESETS[preset]
    cls = {"qwen3": Qwen3Config, "llama": LlamaConfig, "qwen3_moe": Qwen3MoeConfig}[family]
    return cls(**kwargs)


def dtype_kwarg() -> str:
    """transformers >= 4.56 names the load dtype `dtype`; older releases `torch_dtype`."""
    import transformers

    parts = transformers.__version__.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return "dtype"
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _init_preset(preset: str, seed: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(preset_config(preset), **{dtype_kwarg(): torch.float32})


def _train(model, language: MarkovLanguage, steps: int, log: logging.Logger) -> dict[str, float]:
    """Teacher-forced next-token training on the seed's language (AdamW, cosine LR)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / max(1, steps))))
    loss_value = float("nan")
    start = time.monotonic()
    for step in range(steps):
        batch = language.sample(TRAIN_BATCH, TRAIN_SEQ, STREAM_TRAIN, offset=step)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
        if step % 50 == 0 or step == steps - 1:
            log.info("train step %d/%d loss %.4f", step + 1, steps, loss_value)
    model.eval()
    return {"final_loss": loss_value, "entropy_nats": language.entropy_nats(),
            "train_time_s": time.monotonic() - start}


def prepare_preset(preset: str, seed: int, steps: int, log: logging.Logger) -> str | None:
    """Directory of the trained preset (trained and cached on first use); None for steps == 0."""
    if steps == 0:
        return None
    final = cache_root() / f"{preset}-seed{seed}-steps{steps}-c{CORPUS_VERSION}"
    if (final / PRESET_META).is_file():
        return str(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    log.info("training %s (seed %d, %d steps) into %s", preset, seed, steps, final)
    model = _init_preset(preset, seed)
    language = MarkovLanguage(model.config.vocab_size, seed)
    stats = _train(model, language, steps, log)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        model.save_pretrained(tmp)
        meta = {"preset": preset, "seed": seed, "steps": steps, "corpus_version": CORPUS_VERSION, **stats}
        (tmp / PRESET_META).write_text(json.dumps(meta, indent=1, sort_keys=True))
        try:
            os.rename(tmp, final)  # atomic; another process may have won the race
        except OSError:
            if not (final / PRESET_META).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(final)


def read_preset_meta(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    meta = Path(path) / PRESET_META
    if meta.is_file():
        return json.loads(meta.read_text())
    return None


def load_model(source: ModelSource, *, seed: int, train_steps: int | None, dtype: torch.dtype,
               device: str, log: logging.Logger, attn_implementation: str | None = None):
    """(model in eval mode on device, its directory or None)."""
    from transformers import AutoModelForCausalLM

    if source.kind == "preset":
        path = prepare_preset(source.preset, seed, train_steps if train_steps is not None else 0, log)
        if path is None:
            log.warning("%s: untrained (train_steps=0): near-uniform logits, agreement is not meaningful",
                        source.preset)
            model = _init_preset(source.preset, seed).to(dtype)
            return model.to(device).eval(), None
    else:
        path = source.path
    kwargs: dict[str, Any] = {dtype_kwarg(): dtype}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model.to(device).eval(), path


def load_tokenizer(path: str | None):
    if not path or read_preset_meta(path) is not None:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception:  # noqa: BLE001 - a model directory without a tokenizer is fine
        return None


class TokenSource:
    """Prompts, evaluation sequences and probe tokens, identical for every model of a case.

    Tiny presets (or directories saved from one): the seed's synthetic language, from
    streams disjoint from training; every sequence is an independent sample. Models with a
    tokenizer: windows of the fixed evaluation text (corpus.py): evaluation windows side by
    side, never overlapping, in the first part of the text; prompts and probe tokens from the
    rest. Otherwise uniformly random ids (perplexity then only compares the two models).

    prompts(n, length, repeat): each repeat gets its own prompts (repeat 0 is the first set),
    so that a serving repeat never re-sends what an engine may have cached.
    """

    def __init__(self, vocab_size: int, seed: int, *, language_seed: int | None = None, tokenizer=None) -> None:
        self.vocab_size = vocab_size
        self.seed = seed
        self.language = MarkovLanguage(vocab_size, language_seed) if language_seed is not None else None
        self.tokenizer = tokenizer
        self.kind = "synthetic_language" if self.language else ("text" if tokenizer is not None else "random")
        self._ids: list[int] | None = None

    def text_ids(self) -> list[int]:
        if self._ids is None:
            self._ids = text_token_stream(self.tokenizer)
        return self._ids

    def _take(self, n: int, length: int, stream: int, offset: int = 0) -> torch.Tensor:
        if self.language is not None:
            return self.language.sample(n, length, stream, offset)
        if self.tokenizer is not None:
            ids = self.text_ids()
            if stream == STREAM_EVAL:
                try:
                    starts = eval_window_starts(len(ids), n, length)
                except ValueError as exc:
                    raise BadCase(f"eval_tokens: {exc}") from None
            else:
                # Prompts and probes: after the evaluation region; probes far from the prompts.
                index = offset if stream == STREAM_PROMPTS else 10_007 + 101 * offset
                starts = region_starts(len(ids), n, length, index)
            return torch.tensor([take(ids, s, length) for s in starts], dtype=torch.long)
        g = seeded_generator(self.seed, stream * 1_000 + offset)
        return torch.randint(0, self.vocab_size, (n, length), generator=g)

    def prompts(self, n: int, length: int, repeat: int = 0) -> torch.Tensor:
        return self._take(n, length, STREAM_PROMPTS, repeat)

    def eval_sequences(self, n: int, length: int) -> torch.Tensor:
        """Up to n sequences: the text holds fewer non-overlapping windows than asked for at most."""
        return self._take(n, length, STREAM_EVAL)

    def probe_tokens(self, n: int, length: int, offset: int = 0) -> torch.Tensor:
        return self._take(n, length, STREAM_PROBES, offset)

    def facts(self) -> dict[str, Any]:
        """What the data is, for the result's environment."""
        out: dict[str, Any] = {"data": self.kind}
        if self.kind == "text":
            out.update(eval_text_facts())
            out["eval_text_tokens"] = len(self.text_ids())
        return out


def token_source_for(source: ModelSource, path: str | None, vocab_size: int, seed: int, tokenizer) -> TokenSource:
    meta = read_preset_meta(path)
    if source.kind == "preset":
        # Untrained presets still use their own language (for data only).
        return TokenSource(vocab_size, seed, language_seed=seed)
    if meta is not None:
        return TokenSource(vocab_size, seed, language_seed=int(meta["seed"]))
    return TokenSource(vocab_size, seed, tokenizer=tokenizer)


def is_moe_config(config: dict[str, Any]) -> bool:
    """Whether a config.json (as a dict) describes a Mixture-of-Experts model."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        value = config.get(key)
        if isinstance(value, int) and value > 1:
            return True
    return False


def read_config_json(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    cfg = Path(path) / "config.json"
    if cfg.is_file():
        try:
            return json.loads(cfg.read_text())
        except (OSError, ValueError):
            return None
    return None
