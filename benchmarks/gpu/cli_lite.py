"""`peagle train` and `peagle export` with the CLI's own flags and functions, without building the whole
parser: the GPU image has no uvicorn/fastapi, which the server's subcommands import."""
import argparse
import sys

from peagle import cli

p = argparse.ArgumentParser()
sub = p.add_subparsers(dest="cmd", required=True)
t = sub.add_parser("train")
cli._add_train_args(t)
t.set_defaults(func=cli.cmd_train)
cli._add_export_args(sub.add_parser("export"))
args = p.parse_args()
sys.exit(args.func(args))
