"""Does the tiny SFT model make compute allocation matter? Measures the two acceptance criteria.

1. **Spread** — sample ``n`` = 16 completions at temperature 1.0 for each of 500 held-out arith problems;
   the share of problems whose success rate is strictly between 0.1 and 0.9 must be ≥ 30 % (problems that
   are neither always solved nor never solved are where extra samples pay off).
2. **Difficulty** — greedy accuracy must fall with the difficulty level (non-increasing, level 1 > level 5).

The named baseline is one greedy sample: the script prints the ratio of majority-vote@16 and pass@16
accuracy to greedy accuracy, i.e. what spending 16× the compute buys on this model.

Uses transformers ``generate`` directly (batched, ``num_return_sequences=n``), the chat template, and
:func:`isocompute.tasks.answers.extract.extract_answer`. Held-out: problems come from arith seed ``--seed``
(default 0), while SFT trains on seeds ≥ 1,000,000.

    .venv/bin/python bench/eval_tiny.py --model runs/tiny-sft [--problems 500 --n 16 --json out.json]

Measured on the default ``isocompute train sft --task arith --out runs/tiny-sft --threads 1`` (seed 0):
spread 36.2 %, greedy by level 0.617 / 0.357 / 0.031 / 0.000 / 0.000, maj@16 0.188, pass@16 0.472.
Exit status 0 when both criteria pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path


def _generate(model, tokenizer, prompts, *, n, temperature, max_new_tokens, batch_rows):
    """Completions (``len(prompts)`` lists of ``n`` strings); prompts go in chunks of ``batch_rows // n``."""
    import torch

    per_call = max(1, batch_rows // n)
    out = []
    for start in range(0, len(prompts), per_call):
        chunk = prompts[start : start + per_call]
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               tokenize=False) for p in chunk]
        enc = tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, num_return_sequences=n,
                                 do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                                 top_k=0 if temperature > 0 else None, top_p=1.0 if temperature > 0 else None,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        decoded = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        out += [decoded[i * n : (i + 1) * n] for i in range(len(chunk))]
    return out


def _majority(answers):
    counts = collections.Counter(a for a in answers if a is not None)
    return max(counts, key=counts.__getitem__) if counts else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="runs/tiny-sft", help="tiny-sft model directory")
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--n", type=int, default=16, help="samples per problem at --temperature")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="arith seed of the held-out problems (and sampling seed)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-rows", type=int, default=512, help="sequences per generate call")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)

    import torch
    from tqdm import tqdm

    from isocompute.tasks import arith
    from isocompute.tasks.answers.extract import extract_answer
    from isocompute.training.tiny import load_tiny

    torch.set_num_threads(args.threads)
    model, tok = load_tiny(args.model)
    problems = arith.generate(args.problems, args.seed)
    # similar lengths in one batch, so generation stops early for short problems
    order = sorted(range(len(problems)), key=lambda i: len(problems[i].prompt))
    t0 = time.monotonic()
    greedy, sampled = {}, {}
    step = max(1, args.batch_rows // args.n) * 4
    for s in tqdm(range(0, len(order), step), desc="eval", unit="chunk"):
        idx = order[s : s + step]
        prompts = [problems[i].prompt for i in idx]
        g = _generate(model, tok, prompts, n=1, temperature=0.0, max_new_tokens=args.max_new_tokens,
                      batch_rows=args.batch_rows)
        torch.manual_seed(args.seed * 1_000_003 + s)
        smp = _generate(model, tok, prompts, n=args.n, temperature=args.temperature,
                        max_new_tokens=args.max_new_tokens, batch_rows=args.batch_rows)
        for i, gi, si in zip(idx, g, smp, strict=True):
            greedy[i] = extract_answer(gi[0]) == problems[i].gold
            sampled[i] = [extract_answer(c) for c in si]
    seconds = time.monotonic() - t0

    rates = {i: sum(a == problems[i].gold for a in v) / len(v) for i, v in sampled.items()}
    spread = sum(0.1 < r < 0.9 for r in rates.values()) / len(rates)
    # majority@n over extracted answers; ties go to the answer seen first
    majority = {i: _majority(v) == problems[i].gold for i, v in sampled.items()}
    by_level: dict[int, list[int]] = collections.defaultdict(list)
    for i, p in enumerate(problems):
        by_level[p.meta["difficulty"]].append(i)
    rows = []
    for level in sorted(by_level):
        ids = by_level[level]
        rows.append({
            "level": level, "problems": len(ids),
            "greedy": sum(greedy[i] for i in ids) / len(ids),
            "sample_mean": sum(rates[i] for i in ids) / len(ids),
            "pass_at_n": sum(rates[i] > 0 for i in ids) / len(ids),
            "majority": sum(majority[i] for i in ids) / len(ids),
            "spread": sum(0.1 < rates[i] < 0.9 for i in ids) / len(ids),
        })
    greedy_acc = sum(greedy.values()) / len(greedy)
    pass_n = sum(r > 0 for r in rates.values()) / len(rates)
    maj = sum(majority.values()) / len(majority)
    levels_greedy = [r["greedy"] for r in rows]
    monotone = all(a >= b for a, b in zip(levels_greedy, levels_greedy[1:], strict=False))
    falls = monotone and levels_greedy[0] > levels_greedy[-1]
    hist = collections.Counter(round(r * args.n) for r in rates.values())

    print(f"model {args.model}  problems {len(problems)} (arith seed {args.seed})  n {args.n}  "
          f"T {args.temperature}  {seconds:.0f} s")
    print(f"{'level':>5} {'count':>5} {'greedy':>7} {'mean@T':>7} {'maj@n':>7} {'pass@n':>7} {'in(.1,.9)':>9}")
    for r in rows:
        print(f"{r['level']:>5} {r['problems']:>5} {r['greedy']:>7.3f} {r['sample_mean']:>7.3f} "
              f"{r['majority']:>7.3f} {r['pass_at_n']:>7.3f} {r['spread']:>9.3f}")
    print(f"  all {len(problems):>5} {greedy_acc:>7.3f} {sum(rates.values()) / len(rates):>7.3f} {maj:>7.3f} "
          f"{pass_n:>7.3f} {spread:>9.3f}")
    print("successes per problem (out of n): " + " ".join(f"{k}:{hist[k]}" for k in range(args.n + 1)))
    print(f"baseline greedy (1 sample): maj@{args.n}/greedy = {maj / max(greedy_acc, 1e-9):.2f}x, "
          f"pass@{args.n}/greedy = {pass_n / max(greedy_acc, 1e-9):.2f}x")
    ok_spread, ok_falls = spread >= 0.30, falls
    print(f"criterion spread: {spread:.1%} of problems with success rate in (0.1, 0.9) (need >= 30%): "
          f"{'PASS' if ok_spread else 'FAIL'}")
    print(f"criterion difficulty: greedy by level {[round(x, 3) for x in levels_greedy]} non-increasing: "
          f"{'PASS' if ok_falls else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "seed": args.seed, "n": args.n,
                                         "temperature": args.temperature, "spread": spread,
                                         "greedy": greedy_acc, "majority": maj, "pass_at_n": pass_n,
                                         "levels": rows,
                                         "histogram": {str(k): hist[k] for k in range(args.n + 1)},
                                         "seconds": seconds}, indent=2) + "\n")
    return 0 if ok_spread and ok_falls else 1


if __name__ == "__main__":
    sys.exit(main())
