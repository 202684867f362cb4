"""Engines kept up between stages on CUDA: whether the engines a run keeps fit beside the ones
each stage starts, and the slot (GPUs and memory share) each kept engine holds while it is up, so
that no later engine lands on it. When they do not fit, the run stops each engine after its stage
and starts it again when a later one needs it; the plan says why in one line.

Engines never up at the same stage may take turns in one slot. On one GPU (or one group of
tensor-parallel GPUs) the slots split its memory: what each slot's engines need (weights, the KV
cache the load needs, the reserve) summed over the slots must stay within SHARED_TOTAL. On a host
with more, each slot gets identical GPUs of its own. A pure module: the engines, what each needs
and when it may be up are inputs (flows/engines.py builds them from the stages).
"""

from __future__ import annotations

from infra.placement import (
    ALONE_UTILIZATION,
    GIB,
    SHARED_TOTAL,
    EngineNeed,
    KeptSlot,
    Placement,
    Slot,
    device_groups,
    floor_share,
)

NOT_KEPT = "engines not kept between stages: {why}; each is stopped after its stage and started " \
           "again when a later stage needs it"


def keep_up(placement: Placement, needs: list[EngineNeed],
            utilization: float | None = None) -> Placement:
    """`placement` with the engines of `needs` in slots: role "kept" (a stage's engine, up from
    its stage to the last that uses it; a further need of the same stage only reserves its slot
    for more stages), "stage" (the other stages' own) and "beside" (one that is not kept, started
    beside a stage); each with `during`, the stages it may be up in. Where they do not fit,
    `placement` as it is, with a line that says why. `utilization`: the spec's
    gpu_memory_utilization when the user set it."""
    holders = _holders(needs)
    turns = _turns(holders)
    tp = placement.tensor_parallel_size
    wants = [max(need.bytes_per_gpu(tp) for key in turn for need in holders[key]) for turn in turns]
    groups = None if placement.shared else device_groups(placement.gpus, tp, len(turns))
    if groups is not None:
        slots, why = _own_gpus(placement, groups, wants, utilization)
    elif placement.shared:
        slots, why = _split_gpu(placement, wants, utilization, _names(turns, holders))
    else:
        slots, why = None, (f"{len(turns)} engines may be up at once ({_names(turns, holders)}), "
                            f"and this host has {len(placement.gpus) // tp} group(s) of {tp} "
                            "GPU(s) for engines of their own")
    if slots is None:
        return placement.model_copy(update={"keeping": NOT_KEPT.format(why=why)})
    return _placed(placement, holders, turns, slots)


def _holders(needs: list[EngineNeed]) -> dict[tuple[str, str], list[EngineNeed]]:
    """The engines of one slot-holder: each kept stage's own, all the other stages' own
    ("stage"), all the engines started beside that are not kept ("beside")."""
    holders: dict[tuple[str, str], list[EngineNeed]] = {}
    for need in needs:
        key = ("kept", need.stage) if need.role == "kept" else (need.role, "")
        holders.setdefault(key, []).append(need)
    return holders


def _turns(holders: dict[tuple[str, str], list[EngineNeed]]) -> list[list[tuple[str, str]]]:
    """Holders grouped into slots, never two of one slot up at the same stage: the stage
    engines first (the slot an engine alone would get), then the one beside, then the kept."""
    order = sorted(holders, key=lambda key: ("stage", "beside", "kept").index(key[0]))
    turns: list[list[tuple[str, str]]] = []
    busy: list[set[str]] = []
    for key in order:
        during = {stage for need in holders[key] for stage in need.during}
        free = next((i for i, taken in enumerate(busy) if not taken & during), None)
        if free is None:
            turns.append([key])
            busy.append(during)
        else:
            turns[free].append(key)
            busy[free] |= during
    return turns


def _names(turns: list[list[tuple[str, str]]], holders) -> str:
    return ", ".join("/".join(dict.fromkeys(need.stage for key in turn for need in holders[key]))
                     for turn in turns)


def _own_gpus(placement: Placement, groups: list[list[int]], wants: list[int],
              utilization: float | None) -> tuple[list[Slot] | None, str]:
    """Each slot on identical GPUs of its own, at the share an engine alone takes."""
    share = utilization if utilization is not None else ALONE_UTILIZATION
    gpus = {gpu.index: gpu for gpu in placement.gpus}
    for devices, want in zip(groups, wants, strict=True):
        for index in devices:
            gpu = gpus[index]
            if share * gpu.memory_bytes > gpu.memory_bytes - gpu.used_bytes:
                return None, (f"GPU {index} already holds {gpu.used_bytes / GIB:.1f} GiB (another "
                              f"process): an engine of its own there at gpu_memory_utilization "
                              f"{share:g} does not fit")
            if want > share * gpu.memory_bytes:
                return None, (f"an engine needs {want / GIB:.1f} GiB per GPU and GPU {index} "
                              f"gives {share * gpu.memory_bytes / GIB:.1f}")
    return [Slot(devices=devices, gpu_memory_utilization=share) for devices in groups], ""


def _split_gpu(placement: Placement, wants: list[int], utilization: float | None,
               names: str) -> tuple[list[Slot] | None, str]:
    """Every slot on the stage engines' GPUs, their memory split between the slots: equal
    shares where each slot's engines fit one, else each what it needs and an equal part of the
    rest; the shares together within SHARED_TOTAL (and within what other processes left free)."""
    devices = placement.stage.devices
    gpus = [gpu for gpu in placement.gpus if gpu.index in devices]
    memory = min(gpu.memory_bytes for gpu in gpus)
    budget = min([SHARED_TOTAL] + [1 - gpu.used_bytes / gpu.memory_bytes for gpu in gpus])
    parts = [want / memory for want in wants]
    count, on = len(wants), f"GPU(s) {','.join(map(str, devices))}"
    if utilization is not None:
        shares = [utilization] * count
        if count * utilization > budget:
            return None, (f"{count} engines may be up at once ({names}) and at "
                          f"engine.gpu_memory_utilization {utilization:g} each would take "
                          f"{count * utilization:g} of {on}, more than the {floor_share(budget):g} "
                          "they may take")
    elif sum(wants) > budget * memory:
        each = ", ".join(f"{want / GIB:.1f}" for want in wants)
        return None, (f"{count} engines may be up at once ({names}: {each} GiB per GPU) and "
                      f"together need {sum(wants) / GIB:.1f} GiB, more than the "
                      f"{budget * memory / GIB:.1f} GiB ({floor_share(budget):g}) engines sharing "
                      f"{on} may take")
    else:
        equal = floor_share(budget / count)
        rest = budget - sum(parts)
        shares = ([equal] * count if max(parts) <= equal
                  else [floor_share(part + rest / count) for part in parts])
    short = [(want, share) for want, share in zip(wants, shares, strict=True)
             if want > share * memory]
    if short:
        want, share = short[0]
        return None, (f"an engine needs {want / GIB:.1f} GiB per GPU and a share of "
                      f"{share:g} of {on} gives {share * memory / GIB:.1f}")
    return [Slot(devices=devices, gpu_memory_utilization=share) for share in shares], ""


def _placed(placement: Placement, holders, turns, slots: list[Slot]) -> Placement:
    """`placement` with each holder's slot, a row per engine, and the line that says so."""
    memory = {gpu.index: gpu.memory_bytes for gpu in placement.gpus}
    tp = placement.tensor_parallel_size
    kept: dict[str, KeptSlot] = {}
    slot_of: dict[str, Slot] = {}
    rows = []
    for turn, slot in zip(turns, slots, strict=True):
        has = min(memory[i] for i in slot.devices) * slot.gpu_memory_utilization
        for key in turn:
            # A kept engine's first need is its window; any more only reserve its slot.
            engines = holders[key][:1] if key[0] == "kept" else holders[key]
            for need in engines:
                rows.append({"role": need.role, "stage": need.stage, "devices": slot.devices,
                             "gpu_memory_utilization": slot.gpu_memory_utilization,
                             "need_gib": round(need.bytes_per_gpu(tp) / GIB, 2),
                             "share_gib": round(has / GIB, 2)})
            if key[0] == "kept":
                kept[key[1]] = KeptSlot(**slot.model_dump(), until=holders[key][0].during[-1])
            else:
                slot_of[key[0]] = slot
    kept = {key[1]: kept[key[1]] for key in holders if key[0] == "kept"}  # in stage order
    shared = len({tuple(slot.devices) for slot in slots}) < len(slots)
    note = ("the engines share the GPU(s): memory is split between them, and interleaved rounds "
            "alternate, so each runs alone on them" if shared
            else "interleaved rounds compare identical GPUs")
    held = ", ".join(f"{stage} through {slot.until}" for stage, slot in kept.items())
    return placement.model_copy(update={
        "stage": slot_of["stage"], "beside": slot_of.get("beside"), "shared": shared,
        "engines": rows, "note": note, "kept": kept, "up_at_once": len(slots),
        "keeping": f"engines kept up between stages: {held}; at most {len(slots)} up at once, "
                   "each in a slot of its own"})
