"""The targets a section's ``finish`` reports, each kind of gate judged one
way: ``{"name", "met", "got"}`` from the rows' ratios."""

from __future__ import annotations

from collections.abc import Callable


def speedups(
    rows: list[dict], num: str, den: str, where: Callable[[dict], bool] = lambda r: True
) -> list[float]:
    """The median ratio ``num/den`` of every row ``where`` keeps."""
    return [r["ratios"][f"{num}/{den}"]["median"] for r in rows if where(r)]


def at_least(
    name: str, values: list[float], floor: float, *, span: bool = True, digits: int = 2
) -> list[dict]:
    """The target that every median ratio is at least ``floor``, or none
    where no row has one; ``got`` says the lowest and (``span``) the highest."""
    if not values:
        return []
    low, high = min(values), max(values)
    got = f"{low:.{digits}f}x to {high:.{digits}f}x" if span else f"min {low:.{digits}f}x"
    return [{"name": name, "met": low >= floor, "got": got}]


def never_slower(rows: list[dict], name: str, key: str = "stock/flatgather") -> dict:
    """The target that flatgather is never slower than the other side of
    ``key``: no row whose whole 95% interval of the ratio lies below 1x (a
    median below 1 whose interval holds 1 is noise, not a loss)."""
    slower = [r for r in rows if r["ratios"][key]["high"] < 1.0]
    worst = min(r["ratios"][key]["median"] for r in rows)
    got = f"min {worst:.2f}x" + (f", {len(slower)} slower" if slower else "")
    return {"name": name, "met": not slower, "got": got}
