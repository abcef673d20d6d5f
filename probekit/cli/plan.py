"""`probekit plan`: the memory plan of a model on some devices, before anything loads."""

from __future__ import annotations

import argparse
import json

from probekit.core.errors import ProbekitError
from probekit.core.options import positive_int
from probekit.engines.options import checked_type

HELP = "the memory plan of a model on some devices (weights, KV cache, batch, placement)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `probekit plan`."""
    parser.add_argument(
        "--model",
        required=True,
        help="a model folder, its config.json, default, or a hub id in the local cache",
    )
    parser.add_argument(
        "--devices",
        required=True,
        type=checked_type("probekit.engines.plan:parse_devices"),
        metavar="DEVICE=SIZE[,...]",
        help="the devices and their memory, e.g. cuda:0=80GiB,cuda:1=80GiB,cpu=256GiB",
    )
    parser.add_argument(
        "--dtype", default=None, help="float32, bfloat16, float16 (default: the policy's pick)"
    )
    parser.add_argument(
        "--prompt-tokens",
        type=positive_int,
        default=512,
        help="tokens per prompt the batch is planned for (default 512)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=None, help="plan this batch")
    parser.add_argument(
        "--device-map", action="store_true", help="plan a model placed by a device map"
    )
    parser.add_argument("--offload", action="store_true", help="the device map may offload to disk")
    parser.add_argument(
        "--tensor-parallel-size", type=positive_int, default=1, help="plan vLLM over N GPUs"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def execute(args: argparse.Namespace) -> None:
    """Print the plan; one line and exit status 2 when the model does not fit."""
    from probekit.engines.plan import plan

    result = plan(
        args.model,
        args.devices,
        dtype=args.dtype,
        prompt_tokens=args.prompt_tokens,
        batch_size=args.batch_size,
        device_map=args.device_map,
        offload=args.offload,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else "\n".join(result.lines()))
    if not result.fits:
        raise ProbekitError(result.advice)
