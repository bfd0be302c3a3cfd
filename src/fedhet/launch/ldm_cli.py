"""`fedhet ldm pretrain | samples`: the command line of FedBiP's small LDM (docs/fedbip.md "Pretraining the
small LDM"; spec fedbip.md §7.1 item 1).

    fedhet ldm pretrain [CONFIG] [key=value ...] --out DIR [--minutes M] [--steps S] [--resume | --overwrite] [-q]
    fedhet ldm samples CKPT --out grid.png [--per-prompt N] [--steps S] [--guidance G] [--seed S]

`pretrain` trains (or finds in its cache, or continues) the LDM of CONFIG's settings (a YAML file; none: the
defaults) into the diffusers checkpoint folder DIR, as `fedhet pretrain` does for a classifier backbone:
`--minutes` and `--steps` are the overrides `minutes=M` and `unet.steps=S`. `samples` draws a PNG grid (domain ×
class) from a checkpoint written by `pretrain`. Only argparse is imported here, so `fedhet --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedhet.errors import UsageError

PRETRAIN_ONLY = ("minutes", "resume", "overwrite")
SAMPLES_ONLY = ("per_prompt", "guidance", "num_threads")


def add_ldm(sub: Any) -> None:  # Any: argparse's private _SubParsersAction
    """Register `fedhet ldm` on the subcommand parsers `sub`."""
    ldm = sub.add_parser("ldm", help="FedBiP's latent diffusion model: pretrain the small LDM (cached, resumable) | "
                                     "samples (a PNG grid of what a checkpoint generates)")
    ldm.add_argument("action", choices=["pretrain", "samples"])
    ldm.add_argument("config", nargs="?", help="pretrain: a YAML of settings (default: the built-in ones); "
                                               "samples: the checkpoint folder")
    ldm.add_argument("overrides", nargs="*", help="pretrain: settings, e.g. unet.steps=500 vae.blocks=[16,32,64]")
    ldm.add_argument("--out", required=True, help="pretrain: the checkpoint folder; samples: the PNG file")
    ldm.add_argument("--minutes", type=float, default=None, help="pretrain: training time budget (minutes=M)")
    ldm.add_argument("--steps", type=int, default=None, help="pretrain: UNet steps (unet.steps=S); samples: PNDM steps")
    ldm.add_argument("--resume", action="store_true", help="pretrain: continue an interrupted pretraining")
    ldm.add_argument("--overwrite", action="store_true", help="pretrain: start again, replacing a result or state")
    ldm.add_argument("--per-prompt", type=int, default=None, help="samples: images per prompt (default 4)")
    ldm.add_argument("--guidance", type=float, default=None, help="samples: guidance scale (default 7.5)")
    ldm.add_argument("--seed", type=int, default=0, help="samples: the seed of the start noise")
    ldm.add_argument("--num-threads", type=int, default=None,
                     help="samples: torch threads (default: the usable cores, at most 4)")
    ldm.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ldm.set_defaults(func=cmd_ldm)


def _misplaced(args: argparse.Namespace, names: tuple[str, ...], action: str) -> None:
    """A UsageError for flags that belong to the other action."""
    given = [n for n in names if getattr(args, n) not in (None, False)]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise UsageError(f"fedhet ldm {action}: {flags} do(es) not apply here (see fedhet ldm --help)")


def pretrain_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """(CONFIG, overrides) with --minutes / --steps as overrides; a first positional with '=' is an override."""
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config:
        config, overrides = None, [config, *overrides]
    for flag, key, value in (("--minutes", "minutes", args.minutes), ("--steps", "unet.steps", args.steps)):
        if value is not None:
            if any(o.split("=", 1)[0].strip() == key for o in overrides):
                raise UsageError(f"fedhet ldm pretrain: {flag} and {key}= both set {key}; give it once")
            overrides.append(f"{key}={value}")
    return config, overrides


def cmd_ldm(args: argparse.Namespace) -> int:
    """`fedhet ldm pretrain | samples` (module doc)."""
    if args.action == "pretrain":
        _misplaced(args, SAMPLES_ONLY, "pretrain")
        return _pretrain(args)
    _misplaced(args, PRETRAIN_ONLY, "samples")
    if args.config is None or args.overrides or "=" in args.config:
        raise UsageError("fedhet ldm samples takes one checkpoint folder and no key=value settings: fedhet ldm "
                         "samples CKPT --out grid.png")
    from fedhet.launch.ldm_pretrain import ldm_samples
    from fedhet.models.ldm.pretrain_config import SampleSettings

    defaults = SampleSettings()
    settings = SampleSettings(per_prompt=defaults.per_prompt if args.per_prompt is None else args.per_prompt,
                              steps=defaults.steps if args.steps is None else args.steps,
                              guidance=defaults.guidance if args.guidance is None else args.guidance)
    grid = ldm_samples(args.config, Path(args.out), settings, args.seed, progress=not args.quiet,
                       num_threads=args.num_threads)
    print(f"samples: {grid}")
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from fedhet.launch.ldm_pretrain import pretrain_ldm
    from fedhet.models.ldm.pretrain_config import load_pretrain_config

    cfg = load_pretrain_config(*pretrain_overrides(args))
    done = pretrain_ldm(cfg, args.out, resume=args.resume, overwrite=args.overwrite, progress=not args.quiet)
    meta = done.meta
    if not done.trained:
        print(f"LDM found (same settings; --overwrite trains again): {done.path}")
    else:
        steps, seconds, loss = meta["steps"], meta["seconds"], meta["final_loss"]
        print(f"LDM pretrained: {done.path}  (vae {steps['vae']} steps, {seconds['vae']} s, loss {loss['vae']:.4f}; "
              f"unet {steps['unet']} steps, {seconds['unet']} s, loss {loss['unet']:.4f})")
    if "samples" in meta:
        print(f"samples: {done.path / meta['samples']}")
    return 0
