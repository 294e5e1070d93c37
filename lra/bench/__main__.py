"""``python -m lra.bench {attention,train,compile_breaks,profile,pinv,rows,launches,plan,fingerprint} [options]`` (``--help`` on each subcommand lists them)."""

from __future__ import annotations

import argparse

from lra.bench import attention, compile_breaks, fingerprint, launches, pinv, plan, profile, rows, train


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m lra.bench", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    for name, module in (("attention", attention), ("train", train), ("compile_breaks", compile_breaks),
                         ("profile", profile), ("pinv", pinv), ("rows", rows), ("launches", launches), ("plan", plan),
                         ("fingerprint", fingerprint)):
        sub = commands.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        if module not in (profile, pinv, rows):  # profile names its own --variant list, pinv and rows none
            sub.add_argument("--variants", nargs="+", default=None,
                             help="names of configs/attention/*.yaml (default: all; plan: curformer flashcur "
                                  "nystromformer); softmax is always included")
            sub.add_argument("--variant-overrides", nargs="*", default=["liza:base_window=256"],
                             metavar="NAME:KEY=VALUE",
                             help="extra rows: a variant with its own config keys overridden, e.g. "
                                  "liza:base_window=256 (default); pass --variant-overrides with no value for none")
            sub.add_argument("--out", default=None, help="output folder (default: outputs/bench/<timestamp>/)")
        if module in (launches, plan):  # counted on the meta device: no device, no threads
            sub.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16" if module is plan else "fp32",
                             help="the dtype of the attention's inputs (bf16: what autocast's projections give it)")
        elif module is not fingerprint:  # fingerprint: CPU float32, its own --threads
            sub.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
            sub.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (GPU users)")
            sub.add_argument("--threads", type=int, default=None,
                             help="torch.set_num_threads (default: torch's; profile: 1); 1 avoids thread-pool stalls on a shared CPU")
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return root


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
