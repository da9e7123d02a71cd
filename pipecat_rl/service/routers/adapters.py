"""`/adapters`: every adapter with its lineage (parent, children, guard) and which one is live."""

from fastapi import APIRouter, Request

from pipecat_rl.ledger import BASE_ADAPTER
from pipecat_rl.service.bodies import AdapterView
from pipecat_rl.service.security import StrictJSONRoute

router = APIRouter(prefix="/adapters", tags=["adapters"], route_class=StrictJSONRoute)


@router.get("", response_model=list[AdapterView])
def list_adapters(request: Request) -> list[AdapterView]:
    """The base model and every registered adapter, oldest first, with lineage."""
    from pipecat_rl.gate.lineage import ledger_lineage

    ledger = request.app.state.ledger
    records = ledger.adapters()
    pointer = ledger.live()
    live = BASE_ADAPTER if pointer is None else pointer.adapter
    children: dict[str, list[str]] = {}
    for a in records:
        children.setdefault(a.parent or BASE_ADAPTER, []).append(a.name)
    views = [
        AdapterView(
            name=BASE_ADAPTER, kind="base", parent=None, children=children.get(BASE_ADAPTER, []),
            base_model=None, path=None, created_at=None, guard="not_applicable",
            guard_detail="base model", training_sessions=None, live=live == BASE_ADAPTER,
        )
    ]  # fmt: skip
    for a in records:
        lineage = ledger_lineage(ledger, a.name, a.name)
        views.append(
            AdapterView(
                name=a.name, kind="adapter", parent=a.parent or BASE_ADAPTER,
                children=children.get(a.name, []), base_model=a.base_model, path=a.path,
                created_at=a.created_at, guard=lineage.guard, guard_detail=lineage.guard_detail,
                training_sessions=lineage.training_sessions, live=live == a.name,
            )
        )  # fmt: skip
    return views
