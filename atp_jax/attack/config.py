"""``ATPConfig``: one frozen config for every attack method, and the named presets.

The presets are the names the experiment binaries accept in ``--attacks``. ``paper`` is the seed
paper's recipe transcribed (uniform start, λ = 10, Adam lr 0.1, 20 steps, no straight-through);
``atp_joint`` (and ``atp_row`` / ``atp_col`` / ``atp_joint_kl``) is the best ATP configuration measured on
the bundled sample (``atp_st``, see README) — which still does not beat its own controls there.
"""

from __future__ import annotations

import dataclasses
import functools

METHODS = ("atp", "search", "vanilla", "random", "best_of_k", "row_reverse", "col_reverse", "evolution")
MODES = ("row", "col", "joint")
INITS = ("uniform", "identity", "random_perm")
DIRECTIONS = ("gradient", "reversed", "random")


@dataclasses.dataclass(frozen=True)
class ATPConfig:
    """Configuration of an attack.

    method: ``atp`` (Sinkhorn gradient ATP), ``search`` (gradient-guided swap search) or a baseline.
    mode: permute ``row``s, ``col``umns or both (``joint``).
    objective: ``ce`` (reference answer's cross-entropy) or ``kl`` (label-free, paper A.7).
    n_attack: optimisation steps (``atp``) or search iterations (``search``).
    lambda_row, lambda_col: entropy penalty weights; objective = loss − λ_r H(D_r) − λ_c H(D_c).
    lambda_schedule: ``constant`` or ``anneal`` (λ grows linearly from 0: soft early, sharp late).
    lr: Adam learning rate on θ.
    init: θ start: ``uniform`` (init_noise·N(0,1), D ≈ uniform), ``identity`` or ``random_perm``
      (init_scale·P0 + init_noise·N(0,1), D near that hard order).
    sinkhorn_iters, temperature: the Sinkhorn relaxation.
    restarts: R independent starts run as one vmapped computation.
    straight_through: forward with the hard permutation's embeddings, gradient through soft D.
    keep_best: return the best hard order seen during the run, not only the final projection.
    hungarian: ``host`` (SciPy through pure_callback) or ``device`` (optax).
    candidates: swaps evaluated per search iteration (one batched forward).
    direction: ``gradient``; or a control: ``reversed`` (ATP ascends −∇, the search ranks swaps by −Δ) or
      ``random`` (ATP follows a random direction of the gradient's norm, the search ranks swaps at random).
    start_samples: random orders scored before the search; it starts from the best of them and the
      identity (0: start from the identity).
    k: orders sampled by ``best_of_k``; population/generations: ``evolution``.
    seed: PRNG seed (JAX key and numpy generator derive from it).
    """

    method: str = "atp"
    mode: str = "joint"
    objective: str = "ce"
    n_attack: int = 20
    lambda_row: float = 10.0
    lambda_col: float = 10.0
    lambda_schedule: str = "constant"
    lr: float = 0.1
    init: str = "uniform"
    init_scale: float = 3.0
    init_noise: float = 0.01
    sinkhorn_iters: int = 20
    temperature: float = 1.0
    restarts: int = 1
    straight_through: bool = False
    keep_best: bool = False
    hungarian: str = "host"
    candidates: int = 8
    direction: str = "gradient"
    start_samples: int = 0
    k: int = 20
    population: int = 5
    generations: int = 5
    seed: int = 0

    def __post_init__(self):
        for name, value, allowed in (
            ("method", self.method, METHODS), ("mode", self.mode, MODES), ("init", self.init, INITS),
            ("direction", self.direction, DIRECTIONS), ("objective", self.objective, ("ce", "kl")),
            ("hungarian", self.hungarian, ("host", "device")),
            ("lambda_schedule", self.lambda_schedule, ("constant", "anneal")),
        ):
            if value not in allowed:
                raise ValueError(f"ATPConfig.{name}={value!r}; choose one of {', '.join(allowed)}")
        if self.n_attack < 1 or self.restarts < 1 or self.candidates < 1:
            raise ValueError("ATPConfig: n_attack, restarts and candidates must be ≥ 1")


def _paper(**kw) -> ATPConfig:
    return ATPConfig(method="atp", n_attack=20, lambda_row=10.0, lambda_col=10.0, lr=0.1, init="uniform", **kw)


def _engineered(**kw) -> ATPConfig:
    """Measured on the sample (README): start near random hard orders, no entropy penalty, a large step,
    straight-through (the forward is the hard order's exact loss), keep the best order seen, 4 restarts
    x 5 steps in one vmapped run: 20 forwards + 20 backwards, then a true-loss choice among restarts."""
    return ATPConfig(method="atp", n_attack=5, restarts=4, init="random_perm", init_scale=3.0, lambda_row=0.0,
                     lambda_col=0.0, lr=1.0, straight_through=True, keep_best=True, **kw)


def _search(direction: str, **kw) -> ATPConfig:
    """From the original order: 2 gradients x (1 + 8 candidates) = 18 forwards + 2 backwards."""
    return ATPConfig(method="search", n_attack=2, candidates=8, direction=direction, **kw)


def _warm_search(direction: str, **kw) -> ATPConfig:
    """From the best of the original and 8 random orders, then 1 gradient + 11 ranked swaps: 20 forwards
    + 1 backward, the budget of best-of-20. Its controls share the start and the budget."""
    return ATPConfig(method="search", n_attack=1, candidates=11, start_samples=8, direction=direction, **kw)


# Every name the experiment binaries accept. Budgets are kept comparable to best-of-20 (20 forwards).
PRESETS: dict[str, ATPConfig] = {
    "vanilla": ATPConfig(method="vanilla"),
    "random": ATPConfig(method="random"),
    "best_of_k": ATPConfig(method="best_of_k", k=20),
    "row_reverse": ATPConfig(method="row_reverse"),
    "col_reverse": ATPConfig(method="col_reverse"),
    "evolution": ATPConfig(method="evolution"),
    "paper": _paper(mode="joint"),
    # The paper's table columns (ATP Row | ATP Col | ATP Row&Col, and A.7's label-free variant) with the
    # best ATP configuration measured; ``atp_st`` is the same configuration under the name its controls share.
    "atp_row": _engineered(mode="row"),
    "atp_col": _engineered(mode="col"),
    "atp_joint": _engineered(),
    "atp_joint_kl": _engineered(objective="kl"),
    "atp_st": _engineered(),
    "atp_st_reversed": _engineered(direction="reversed"),
    "atp_st_random": _engineered(direction="random"),
    "search": _search("gradient"),
    "search_reversed": _search("reversed"),
    "search_random": _search("random"),
    "search_warm": _warm_search("gradient"),
    "search_warm_reversed": _warm_search("reversed"),
    "search_warm_random": _warm_search("random"),
}


# Names that stand for several attacks in ``--attacks``: the paper's table columns (Vanilla | Rand | Best 20 |
# Row Rvs | Col Rvs | E-Search | ATP Row | ATP Col | ATP Row&Col), and everything.
ATTACK_GROUPS: dict[str, tuple[str, ...]] = {
    "paper_table": ("vanilla", "random", "best_of_k", "row_reverse", "col_reverse", "evolution", "atp_row", "atp_col",
                    "atp_joint"),
    "all": tuple(PRESETS),
}


def attack_names(names) -> list[str]:
    """``names`` with groups expanded, duplicates dropped, in order; unknown names raise ``ValueError``."""
    expanded = [a for name in names for a in ATTACK_GROUPS.get(name, (name,))]
    unknown = []
    for name in expanded:
        try:
            preset(name)
        except ValueError as e:
            # An override's own message says what is wrong with it; an unknown base is listed by name.
            unknown.append(str(e) if name.partition("@")[0] in PRESETS else name)
    if unknown:
        raise ValueError(f"unknown attack(s) {'; '.join(unknown)}; known: {', '.join(PRESETS)}, "
                         f"or a group: {', '.join(ATTACK_GROUPS)}; a preset takes field overrides as "
                         "NAME@field=value,field=value (e.g. atp_st@init=uniform)")
    return list(dict.fromkeys(expanded))


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(ATPConfig)}  # "str", "int", "float", "bool"
_BOOLS = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def _parse_overrides(name: str, spec: str) -> dict:
    """``field=value,field=value`` → typed overrides; the error names the attack and the bad item."""
    overrides = {}
    for item in spec.split(","):
        field, sep, text = item.partition("=")
        if not sep or field not in _FIELD_TYPES:
            raise ValueError(f"{name!r}: {item!r} is not field=value with a field of ATPConfig "
                             f"({', '.join(_FIELD_TYPES)})")
        kind = _FIELD_TYPES[field]
        try:
            if kind == "bool":
                overrides[field] = _BOOLS[text.lower()]
            else:
                overrides[field] = {"int": int, "float": float}.get(kind, str)(text)
        except (KeyError, ValueError):
            raise ValueError(f"{name!r}: {field}={text!r} is not a valid {kind}") from None
    return overrides


def preset(name: str, **overrides) -> ATPConfig:
    """The named configuration, with fields overridden (e.g. ``preset("paper", seed=3)``).

    The name itself may carry overrides, ``NAME@field=value,field=value`` (``atp_st@init=uniform``,
    ``paper@straight_through=on,n_attack=40``), so any variant can be run and recorded by name.
    """
    base, _, spec = name.partition("@")
    if base not in PRESETS:
        raise ValueError(f"unknown attack {base!r}; known: {', '.join(PRESETS)}")
    named = _parse_overrides(name, spec) if spec else {}
    return dataclasses.replace(PRESETS[base], **{**named, **overrides})


def one_option_changes(config: ATPConfig) -> dict[str, ATPConfig]:
    """The engineering options of an ATP configuration, each changed alone (an ablation, leave one out).

    Keys label the change (``init=uniform``, ``straight_through=off``, ``restarts=1x20``, …). Every
    variant spends the same gradient steps as ``config`` (restarts × n_attack), so differences come from
    the option, not the budget. Options: each other θ initialisation; straight-through and keep-best
    flipped; λ switched on (the paper's 10, constant and annealed) when off, or off when on; the learning
    rate a tenth; restarts folded into one long run (or a long run split into 4).
    """
    if config.method != "atp":
        raise ValueError(f"one_option_changes: method={config.method!r}; the options belong to ATP presets")
    change = functools.partial(dataclasses.replace, config)
    variants = {f"init={init}": change(init=init) for init in INITS if init != config.init}
    variants["straight_through=" + ("off" if config.straight_through else "on")] = change(
        straight_through=not config.straight_through)
    variants["keep_best=" + ("off" if config.keep_best else "on")] = change(keep_best=not config.keep_best)
    if config.lambda_row == 0 and config.lambda_col == 0:
        variants["lambda=10"] = change(lambda_row=10.0, lambda_col=10.0, lambda_schedule="constant")
        variants["lambda=10,anneal"] = change(lambda_row=10.0, lambda_col=10.0, lambda_schedule="anneal")
    else:
        variants["lambda=0"] = change(lambda_row=0.0, lambda_col=0.0)
        other = "constant" if config.lambda_schedule == "anneal" else "anneal"
        variants[f"lambda_schedule={other}"] = change(lambda_schedule=other)
    variants[f"lr={config.lr / 10:g}"] = change(lr=config.lr / 10)
    steps = config.n_attack * config.restarts
    if config.restarts > 1:
        variants[f"restarts=1x{steps}"] = change(restarts=1, n_attack=steps)
    elif steps >= 4:
        variants[f"restarts=4x{steps // 4}"] = change(restarts=4, n_attack=steps // 4)
    return variants
