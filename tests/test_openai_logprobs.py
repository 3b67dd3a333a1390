"""The OpenAI ``logprobs`` object: ``to_openai_style_logprobs`` as
flatgather replaces it, against the release's own function, on tuples whose
texts a real ``transformers`` tokenizer decoded (byte-level BPE: single
tokens that decode to U+FFFD, which from 0.5.21 the release renders from
the token's bytes), ``None`` texts and positions, any float; the object
compared whole (its class, the fields set at construction, every list with
its values' types) and as the JSON the server sends."""

from __future__ import annotations

import flatgather.sglang
import pytest
import sglang.srt.layers.logits_processor  # noqa: F401 - before the stand-in
from _sglang import assert_same
from conftest import left_stock
from engine import models
from flatgather.sglang.patches import openai_logprobs
from flatgather.sglang.patches.openai_logprobs import runtime
from flatgather.testing import install_sgl_kernel_stand_in
from hypothesis import given, settings
from hypothesis import strategies as st

# Up to 0.5.12 the serving modules import modules that need sgl_kernel; the
# conversion needs none of it.
install_sgl_kernel_stand_in()
utils = pytest.importorskip("sglang.srt.entrypoints.openai.utils")
# The release's own function, before any test patches it.
STOCK = vars(utils)[runtime.NAME]
LOSSLESS = runtime.takes_tokenizer(STOCK)
VOCAB = models.VOCAB


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    where = models.make_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    return AutoTokenizer.from_pretrained(str(where))


def installed():
    report = flatgather.sglang.install()
    if getattr(vars(utils)[runtime.NAME], "__flatgather__", None) != runtime.NAME:
        left_stock(f"{runtime.NAME} ({report.notes})")
    return report


def whole(out) -> dict:
    """The object as a reader of it sees it, and the JSON it becomes."""
    return {
        "class": type(out),
        "set": sorted(out.model_fields_set),
        "fields": dict(vars(out)),
        "json": out.model_dump_json(),
    }


def call(fn, args, tokenizer):
    return fn(*args, tokenizer) if LOSSLESS else fn(*args)


@pytest.mark.matrix
def test_install_replaces_it_where_it_is_imported_and_uninstall_restores_it():
    import importlib

    report = installed()
    assert any(
        p.patch == openai_logprobs.OPENAI and p.state == "applied" for p in report.patches
    ), report.patches
    holders = []
    for name in openai_logprobs.MODULES[1:]:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if runtime.NAME in vars(module):
            holders.append(module)
            assert getattr(vars(module)[runtime.NAME], "__flatgather__", None) == runtime.NAME
    assert holders, "no serving module imports it: this proves nothing of the importers"
    flatgather.sglang.uninstall()
    for module in (utils, *holders):
        assert vars(module)[runtime.NAME] is STOCK, module.__name__


def test_the_option_leaves_it_stock():
    report = flatgather.sglang.install(openai_logprobs=False)
    assert vars(utils)[runtime.NAME] is STOCK
    assert not any(p.patch == openai_logprobs.OPENAI for p in report.patches)


values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none())
ids = st.integers(0, VOCAB - 1)


@st.composite
def triples(draw, tokenizer, size):
    """``(logprob, id, text)`` tuples as the tokenizer manager makes them:
    the text of the id by itself (U+FFFD for a byte of a longer character),
    or ``None`` (no texts asked for)."""
    n = draw(st.integers(0, size))
    out = []
    for _ in range(n):
        token = draw(ids)
        text = draw(st.sampled_from(["decoded", "decoded", "none"]))
        out.append((draw(values), token, tokenizer.decode([token]) if text == "decoded" else None))
    return out


@st.composite
def arguments(draw, tokenizer):
    def maybe(strategy):
        return draw(st.one_of(st.none(), strategy))

    tokens = st.lists(st.none() | triples(tokenizer, 6), max_size=8)
    return (
        maybe(triples(tokenizer, 20)),
        maybe(triples(tokenizer, 4)),
        maybe(tokens),
        maybe(tokens),
    )


@pytest.mark.matrix
@settings(deadline=None, max_examples=150)
@given(data=st.data(), with_tokenizer=st.booleans(), fresh=st.booleans())
def test_it_answers_as_the_release(tokenizer, data, with_tokenizer, fresh):
    installed()
    if fresh:
        runtime.forget_rendered()
    args = data.draw(arguments(tokenizer))
    tok = tokenizer if with_tokenizer else None
    expected = whole(call(STOCK, args, tok))
    assert_same(whole(call(vars(utils)[runtime.NAME], args, tok)), expected)


@pytest.mark.matrix
def test_fragments_and_missing_texts_are_the_release_s(tokenizer):
    """The texts the one-pass path does not take itself: a byte of a longer
    character (U+FFFD) and ``None``, in the token lists and the top-k dicts
    alike; the tokenizer really gave a fragment here."""
    installed()
    fragments = [t for t in range(VOCAB) if "\ufffd" in tokenizer.decode([t])]
    assert fragments, "the tokenizer decodes no single token to U+FFFD"
    picked = fragments[:3]
    tokens = [(-0.5, t, tokenizer.decode([t])) for t in picked] + [(-1.0, 7, None)]
    args = (tokens, tokens[:1], [tokens, None, []], [tokens[::-1]])
    for tok in (tokenizer, None):
        expected = whole(call(STOCK, args, tok))
        assert_same(whole(call(vars(utils)[runtime.NAME], args, tok)), expected)


class Renders:
    """Counts the calls of the release's ``_lossless_token_text`` (by its
    code object, through the profiler hook: replacing the function in its
    module would make flatgather hand every call to the release)."""

    def __enter__(self):
        import sys

        code = getattr(utils, runtime.LOSSLESS).__code__
        self.calls = 0

        def hook(frame, event, arg):
            if event == "call" and frame.f_code is code:
                self.calls += 1

        self.previous = sys.getprofile()
        sys.setprofile(hook)
        return self

    def __exit__(self, *exc):
        import sys

        sys.setprofile(self.previous)


@pytest.mark.matrix
def test_a_fragment_is_rendered_once_per_tokenizer(tokenizer):
    """From 0.5.21: a fragment's lossless text is worked out once per
    tokenizer object, id and text; a tokenizer whose pieces may not be the
    library's (a ``convert_ids_to_tokens`` of its own) every time."""
    if not LOSSLESS:
        pytest.skip(f"SGLang's {runtime.NAME} renders no fragments before 0.5.21")
    installed()
    runtime.forget_rendered()
    fragments = [t for t in range(VOCAB) if "\ufffd" in tokenizer.decode([t])][:4]
    assert len(fragments) == 4, "the tokenizer decodes too few single tokens to U+FFFD"
    tokens = [(-0.5, t, tokenizer.decode([t])) for t in fragments * 2]
    args = (tokens, None, [tokens, tokens], None)
    ours = vars(utils)[runtime.NAME]
    with Renders() as renders:
        first = whole(ours(*args, tokenizer))
    assert renders.calls == len(fragments)
    with Renders() as renders:
        assert whole(ours(*args, tokenizer)) == first
    assert renders.calls == 0
    assert_same(first, whole(STOCK(*args, tokenizer)))

    base = type(tokenizer)

    class OwnPieces(base):
        def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
            return base.convert_ids_to_tokens(self, ids, skip_special_tokens)

    other = object.__new__(OwnPieces)
    other.__dict__.update(tokenizer.__dict__)
    with Renders() as renders:
        assert_same(whole(ours(*args, other)), whole(STOCK(*args, other)))
    # flatgather's and the release's call, each once per fragment met.
    assert renders.calls == 2 * 3 * len(tokens)


@pytest.mark.matrix
def test_the_install_check_leaves_the_release_no_dead_tokenizer_s_id():
    """The release remembers byte-level tokenizers by ``id``: the ids the
    install check adds there must be of an object that stays alive (else the
    next object at that address, of any kind, would pass for byte-level)."""
    if not LOSSLESS:
        pytest.skip(f"SGLang's {runtime.NAME} remembers no tokenizer before 0.5.21")
    from flatgather.sglang.patches.openai_logprobs import check

    remembered = vars(utils)["_BYTE_LEVEL_TOKENIZERS"]
    before = set(remembered)
    installed()
    added = set(remembered) - before
    assert added <= {id(check.STAND_IN)}, added
    flatgather.sglang.uninstall()
    installed()  # a second install's check adds nothing new
    assert set(remembered) - before <= {id(check.STAND_IN)}
