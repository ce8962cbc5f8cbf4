"""The override grammar: every error names its token and the valid choices; valid text
round-trips through the canonical form; the most specific pattern wins."""

from __future__ import annotations

import itertools
import pickle
import re

import pytest

from opmux.kernels.overrides import (
    OverrideError,
    OverrideRule,
    Overrides,
    forced_backend,
    parse_overrides,
)

KNOWN = {
    "layernorm.rmsnorm": ("torch", "triton", "jit", "aot"),
    "layernorm.fused_add_rmsnorm": ("torch", "jit"),
    "activation.silu_and_mul": ("torch", "triton"),
    "quantization.fp8": ("torch", "torch_npu"),
}

# (text, bad token, a fragment of the valid choices the message must list)
ALL_RMSNORM = "aot, jit, torch, triton"
GRAMMAR = "'group.op=backend[,backend...]', 'group.*=...' or '*=...'"
INVALID = [
    ("layernorm.rmsnrom=triton", "layernorm.rmsnrom", "layernorm.fused_add_rmsnorm, layernorm.rmsnorm"),
    ("layernrm.*=torch", "layernrm", "activation.*, layernorm.*, quantization.*"),
    ("layernorm.rmsnorm=cutlass", "cutlass", ALL_RMSNORM),
    ("layernorm.fused_add_rmsnorm=triton", "triton", "valid choices: jit, torch"),
    ("activation.*=jit", "jit", "valid choices: torch, triton"),
    ("*=cutlass", "cutlass", "aot, jit, torch, torch_npu, triton"),
    ("layernorm.rmsnorm=", "empty backend list", ALL_RMSNORM),
    ("layernorm.rmsnorm=  ", "empty backend list", ALL_RMSNORM),
    ("layernorm.rmsnorm=triton,,jit", "triton,,jit", ALL_RMSNORM),
    ("layernorm.rmsnorm=triton,", "triton,", ALL_RMSNORM),
    ("layernorm.rmsnorm=triton,triton", "duplicate backend: 'triton'", ALL_RMSNORM),
    ("layernorm.rmsnorm", "missing '='", GRAMMAR),
    ("=triton", "empty pattern", GRAMMAR),
    ("layer-norm.rmsnorm=triton", "layer-norm.rmsnorm", GRAMMAR),
    ("layernorm.rmsnorm=tri ton", "tri ton", ALL_RMSNORM),
    ("layernorm.rmsnorm.x=triton", "layernorm.rmsnorm.x", "expected 'group.op', 'group.*' or '*'"),
    ("layernorm=triton", "layernorm", "did you mean 'layernorm.*'?"),
    ("layernorm.rmsnorm=triton;", "empty rule", GRAMMAR),
    (";layernorm.rmsnorm=triton", "empty rule", GRAMMAR),
    ("layernorm.rmsnorm=triton;;*=torch", "empty rule", GRAMMAR),
    ("layernorm.rmsnorm=triton=jit", "=jit", GRAMMAR),
    ("layernorm.rmsnorm=triton garbage", "triton garbage", ALL_RMSNORM),
    ("layernorm.*.*=torch", "layernorm.*.*", "expected 'group.op', 'group.*' or '*'"),
    ("*.rmsnorm=torch", "*.rmsnorm", GRAMMAR),
    ("layernorm.rmsnorm=triton/jit", "triton/jit", ALL_RMSNORM),
    ("layernorm.rmsnorm=triton;activation.silu_and_mul=jit", "jit", "valid choices: torch, triton"),
    ("LayerNorm.RMSNorm=triton", "LayerNorm.RMSNorm", "did you mean 'layernorm.rmsnorm'?"),
    ("layernorm.rmsnorm=triton;bogus.op=jit", "bogus.op", "quantization.fp8"),
    ("layernorm.rmsnorm:triton", "layernorm.rmsnorm:triton", GRAMMAR),
]


@pytest.mark.parametrize(("text", "token", "choices"), INVALID, ids=[t for t, _, _ in INVALID])
def test_invalid_strings_name_the_token(text: str, token: str, choices: str) -> None:
    with pytest.raises(ValueError, match=re.escape(token)) as info:
        parse_overrides(text, known=KNOWN)
    message = str(info.value)
    assert re.search(r"in rule \d+ of \d+", message)  # says where
    assert choices in message  # and what would have been valid


def test_invalid_table_is_large() -> None:
    assert len(INVALID) >= 18


def test_error_says_which_rule() -> None:
    with pytest.raises(OverrideError, match=r"in rule 2 of 2 \('activation.silu_and_mul=jit'\)") as info:
        parse_overrides("layernorm.*=torch; activation.silu_and_mul=jit", known=KNOWN)
    assert info.value.token == "jit"
    assert info.value.choices == ("torch", "triton")


def test_error_suggests_close_match() -> None:
    with pytest.raises(ValueError, match=r"did you mean .layernorm.rmsnorm.\?"):
        parse_overrides("layernorm.rmsnrom=torch", known=KNOWN)


def test_error_pickles() -> None:
    with pytest.raises(OverrideError) as info:
        parse_overrides("layernorm.rmsnorm=cutlass", known=KNOWN)
    clone = pickle.loads(pickle.dumps(info.value))
    assert type(clone) is OverrideError
    assert str(clone) == str(info.value)
    assert (clone.token, clone.choices) == ("cutlass", info.value.choices)


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_empty_means_no_overrides(text: str) -> None:
    result = parse_overrides(text, known=KNOWN)
    assert result == Overrides(())
    assert not result
    assert str(result) == ""
    assert result.backends_for("layernorm.rmsnorm") is None


def _valid_cases() -> list[Overrides]:
    """Every pattern kind x backend lists of 1-3, and multi-rule combinations."""
    rules: list[OverrideRule] = []
    patterns = [*sorted(KNOWN), "layernorm.*", "activation.*", "quantization.*", "*"]
    for pattern in patterns:
        if pattern == "*":
            pool = sorted({b for bs in KNOWN.values() for b in bs})
        elif pattern.endswith(".*"):
            pool = sorted({b for op, bs in KNOWN.items() if op.startswith(pattern[:-1]) for b in bs})
        else:
            pool = list(KNOWN[pattern])
        for n in (1, 2, 3):
            for combo in itertools.islice(itertools.permutations(pool, n), 4):
                rules.append(OverrideRule(pattern, combo))
    cases = [Overrides((r,)) for r in rules]
    cases += [Overrides(tuple(rules[i : i + k])) for k in (2, 3, 5) for i in range(0, len(rules) - k, 7)]
    return cases


CASES = _valid_cases()


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_round_trip(case: Overrides) -> None:
    text = str(case)
    assert parse_overrides(text, known=KNOWN) == case
    # Whitespace around every token is tolerated and does not change the value.
    spaced = re.sub(r"([;=,])", r"  \1 ", f" {text} ")
    assert parse_overrides(spaced, known=KNOWN) == case


def test_round_trip_case_count() -> None:
    assert len(CASES) >= 50


def test_parse_classmethod_matches_function() -> None:
    text = "layernorm.*=jit;*=torch"
    assert Overrides.parse(text, known=KNOWN) == parse_overrides(text, known=KNOWN)


@pytest.mark.parametrize(
    ("text", "op", "expected"),
    [
        ("*=torch;layernorm.*=jit;layernorm.rmsnorm=triton", "layernorm.rmsnorm", ("triton",)),
        ("layernorm.rmsnorm=triton;layernorm.*=jit;*=torch", "layernorm.rmsnorm", ("triton",)),
        ("layernorm.rmsnorm=triton;layernorm.*=jit;*=torch", "layernorm.fused_add_rmsnorm", ("jit",)),
        ("layernorm.rmsnorm=triton;layernorm.*=jit;*=torch", "activation.silu_and_mul", ("torch",)),
        ("layernorm.*=jit", "activation.silu_and_mul", None),
        ("layernorm.rmsnorm=triton;layernorm.rmsnorm=jit,torch", "layernorm.rmsnorm", ("jit", "torch")),
        ("layernorm.*=torch;layernorm.*=jit", "layernorm.rmsnorm", ("jit",)),
        ("*=triton;*=torch", "quantization.fp8", ("torch",)),
        ("layernorm.*=jit,torch", "layernorm.rmsnorm", ("jit", "torch")),
    ],
)
def test_specificity(text: str, op: str, expected: tuple[str, ...] | None) -> None:
    assert parse_overrides(text, known=KNOWN).backends_for(op) == expected


def test_group_backend_valid_if_any_matched_op_has_it() -> None:
    # triton exists for rmsnorm but not fused_add_rmsnorm: accepted for the group, and the
    # selector (not the parser) decides what it means for fused_add_rmsnorm.
    result = parse_overrides("layernorm.*=triton", known=KNOWN)
    assert result.backends_for("layernorm.fused_add_rmsnorm") == ("triton",)


def test_rule_rejects_bad_syntax_when_built() -> None:
    with pytest.raises(ValueError, match="duplicate backend"):
        OverrideRule("layernorm.rmsnorm", ("jit", "jit"))
    with pytest.raises(ValueError, match=r"a\.b\.c"):
        OverrideRule("a.b.c", ("jit",))
    with pytest.raises(ValueError, match="empty backend list"):
        OverrideRule("*", ())


def test_known_must_use_group_op_names() -> None:
    with pytest.raises(ValueError, match="'rmsnorm'"):
        parse_overrides("*=torch", known={"rmsnorm": ("torch",)})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("triton", ("triton",)), (" triton , jit ", ("triton", "jit")), (["aot", "torch"], ("aot", "torch"))],
)
def test_forced_backend_valid(value: str | list[str], expected: tuple[str, ...]) -> None:
    assert (
        forced_backend(value, op="layernorm.rmsnorm", known_backends=KNOWN["layernorm.rmsnorm"]) == expected
    )


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("cutlass", "cutlass"),
        ("", "empty backend list"),
        ([], "empty backend list"),
        ("jit,jit", "jit"),
        ("jit,", "jit,"),
        ("tri ton", "tri ton"),
        (["triton", "cuda"], "cuda"),
    ],
)
def test_forced_backend_invalid(value: str | list[str], token: str) -> None:
    with pytest.raises(ValueError, match=re.escape(token)) as info:
        forced_backend(value, op="layernorm.rmsnorm", known_backends=KNOWN["layernorm.rmsnorm"])
    assert "layernorm.rmsnorm" in str(info.value)
    if token == "cutlass":
        assert "aot, jit, torch, triton" in str(info.value)


def test_forced_backend_type_error() -> None:
    with pytest.raises(TypeError, match="backend="):
        forced_backend(3, op="layernorm.rmsnorm", known_backends=("torch",))  # type: ignore[arg-type]
