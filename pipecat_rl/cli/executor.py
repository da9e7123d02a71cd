"""The flags that say where simulated episodes run, shared by `simulate` and `gate`."""

from typing import Annotated, Any, Literal

import typer

ExecutorOpt = Annotated[
    Literal["local", "ray"],
    typer.Option(
        "--executor",
        help="Where episodes run: in this process (local), or one Ray task each across a "
        "cluster (ray; needs the [ray] extra). The driver writes the ledger either way.",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="With --executor ray: the cluster (auto, ray://HOST:10001, HOST:PORT; default "
        "Ray's own: $RAY_ADDRESS, a cluster on this machine, else a new local one).",
    ),
]
RayEndpointOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--ray-endpoint",
        metavar="URL",
        help="With --executor ray: a served model (one vLLM per node) to balance episodes "
        "over; repeat it per node (default: the run's one --llm-url).",
    ),
]


def executor_fields(
    executor: str, ray_address: str | None, ray_endpoints: list[str] | None
) -> dict[str, Any]:
    """`SimulationOptions`' executor fields from the flags.

    Ray's flags without `--executor ray` are a usage error: they would be ignored.
    """
    if executor != "ray" and (ray_address or ray_endpoints):
        raise typer.BadParameter("--ray-address and --ray-endpoint need --executor ray")
    return {
        "executor": executor,
        "ray_address": ray_address,
        "ray_endpoints": tuple(ray_endpoints or ()),
    }
