"""The front end's logprob tuples: the tokenizer manager's
``detokenize_logprob_tokens`` and ``detokenize_top_logprobs_tokens`` as
flatgather replaces them, against the release's own functions on a real
``transformers`` tokenizer (byte-level BPE, single tokens that decode to
partial UTF-8), with and without texts; one tokenizer call per call at most,
none for ids decoded before; the release's code for any tokenizer whose
texts may depend on more than the id."""

from __future__ import annotations

import flatgather.sglang
import pytest
from _sglang import assert_same
from conftest import left_stock
from engine import models
from flatgather.sglang.patches import front_end
from flatgather.sglang.patches.front_end import runtime
from flatgather.sglang.patching import release_function
from flatgather.testing import install_sgl_kernel_stand_in
from hypothesis import given, settings
from hypothesis import strategies as st

# Up to 0.5.12 the tokenizer manager imports modules that need sgl_kernel;
# its two functions need none of it.
install_sgl_kernel_stand_in()
tm = pytest.importorskip("sglang.srt.managers.tokenizer_manager")
Manager = tm.TokenizerManager
# The release's own functions, before any test patches them.
STOCK_ONE = vars(Manager)[runtime.ONE]
STOCK_TOP = vars(Manager)[runtime.TOP]
VOCAB = models.VOCAB


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    where = models.make_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    return AutoTokenizer.from_pretrained(str(where))


class Counting:
    """Counts ``batch_decode`` calls and the sequences they decode, while
    in a ``with`` block, by wrapping the library's own method where it is
    defined (a tokenizer with a ``batch_decode`` of its own would be one of
    another kind to flatgather)."""

    def __enter__(self):
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase as base

        self.calls, self.sequences = 0, 0
        self.real = real = vars(base)["batch_decode"]

        def batch_decode(tok, sequences, *args, **kwargs):
            self.calls += 1
            self.sequences += len(sequences)
            return real(tok, sequences, *args, **kwargs)

        base.batch_decode = batch_decode
        return self

    def __exit__(self, *exc):
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase as base

        base.batch_decode = self.real


def managers(tokenizer):
    """The release's manager (its own two functions) and flatgather's (the
    class as installed), sharing one tokenizer; neither constructed (only
    the functions under test read it)."""

    class Stock(Manager):
        detokenize_logprob_tokens = STOCK_ONE
        detokenize_top_logprobs_tokens = STOCK_TOP

    stock, patched = object.__new__(Stock), object.__new__(Manager)
    stock.tokenizer = patched.tokenizer = tokenizer
    return stock, patched


def installed():
    report = flatgather.sglang.install()
    for fn in (runtime.ONE, runtime.TOP):
        if getattr(vars(Manager)[fn], "__flatgather__", None) != fn:
            left_stock(f"TokenizerManager.{fn} ({report.notes})")
    return report


@pytest.mark.matrix
def test_install_replaces_both_and_uninstall_restores_them():
    report = installed()
    assert any(p.patch == front_end.FRONT_END and p.state == "applied" for p in report.patches)
    assert release_function(Manager, runtime.TOP) is STOCK_TOP
    flatgather.sglang.uninstall()
    assert vars(Manager)[runtime.ONE] is STOCK_ONE
    assert vars(Manager)[runtime.TOP] is STOCK_TOP


def test_the_option_leaves_the_front_end_stock():
    report = flatgather.sglang.install(front_end=False)
    assert vars(Manager)[runtime.TOP] is STOCK_TOP
    assert not any(p.patch == front_end.FRONT_END for p in report.patches)


values = st.floats(allow_nan=True, allow_infinity=True, width=32)
ids = st.integers(0, VOCAB - 1)


@st.composite
def positions(draw):
    """A top function's arguments: per position, values and ids (more ids
    than values at times, as the release tolerates); empty positions."""
    n = draw(st.integers(0, 12))
    vals, idxs = [], []
    for _ in range(n):
        k = draw(st.integers(0, 6))
        vals.append([draw(values) for _ in range(k)])
        idxs.append(draw(st.lists(ids, min_size=k, max_size=k + draw(st.integers(0, 1)))))
    return vals, idxs


@pytest.mark.matrix
@settings(deadline=None)
@given(call=positions(), text=st.booleans(), fresh=st.booleans())
def test_the_top_function_answers_as_the_release(tokenizer, call, text, fresh):
    installed()
    if fresh:
        runtime.forget_texts()
    stock, patched = managers(tokenizer)
    vals, idxs = call
    with Counting() as counting:
        expected = STOCK_TOP(stock, vals, idxs, text)
        stock_calls, counting.calls = counting.calls, 0
        actual = patched.detokenize_top_logprobs_tokens(vals, idxs, text)
    assert_same(actual, expected)
    # The release decodes each position with values on its own; the
    # replacement, every position of the call in one go, or not at all.
    assert stock_calls == (sum(1 for v in vals if v) if text else 0)
    assert counting.calls <= 1


@pytest.mark.matrix
@settings(deadline=None)
@given(
    vals=st.lists(values, max_size=20), extra=st.integers(0, 2), text=st.booleans(), data=st.data()
)
def test_the_one_position_function_answers_as_the_release(tokenizer, vals, extra, text, data):
    installed()
    idxs = data.draw(st.lists(ids, min_size=len(vals), max_size=len(vals) + extra))
    stock, patched = managers(tokenizer)
    expected = STOCK_ONE(stock, vals, idxs, text)
    assert_same(patched.detokenize_logprob_tokens(vals, idxs, text), expected)


@pytest.mark.matrix
def test_ids_decoded_once_are_not_decoded_again(tokenizer):
    installed()
    runtime.forget_texts()
    _, patched = managers(tokenizer)
    vals, idxs = [[-1.0, -2.0]] * 3, [[5, 6], [6, 7], [5, 7]]
    with Counting() as counting:
        first = patched.detokenize_top_logprobs_tokens(vals, idxs, True)
        assert (counting.calls, counting.sequences) == (1, 3)
        again = patched.detokenize_top_logprobs_tokens(vals, idxs, True)
        assert counting.calls == 1 and again == first
    # Another tokenizer object has texts of its own.
    other = type(tokenizer).__new__(type(tokenizer))
    other.__dict__.update(tokenizer.__dict__)
    _, elsewhere = managers(other)
    with Counting() as counting:
        assert elsewhere.detokenize_top_logprobs_tokens(vals, idxs, True) == first
        assert (counting.calls, counting.sequences) == (1, 3)


def test_a_tokenizer_with_its_own_decode_gets_the_release_s_code(tokenizer):
    """A ``decode`` of its own may read more than the id (a prefix space
    after a given token): its texts come from the release's code, one call
    per position, and are the release's."""
    installed()
    base = type(tokenizer)

    class Contextual(base):
        def decode(self, token_ids, *args, **kwargs):
            texts = base.decode(self, token_ids, *args, **kwargs)
            return [f"{t}@{n}" for n, t in enumerate(texts)] if isinstance(texts, list) else texts

    odd = object.__new__(Contextual)
    odd.__dict__.update(tokenizer.__dict__)
    stock, patched = managers(odd)
    vals, idxs = [[-1.0, -2.0], [-3.0]], [[5, 6], [7]]
    expected = STOCK_TOP(stock, vals, idxs, True)
    with Counting() as counting:
        assert patched.detokenize_top_logprobs_tokens(vals, idxs, True) == expected
        assert counting.calls == 2
    assert expected[0][1][2].endswith("@1")


def test_a_manager_with_its_own_one_position_function_keeps_it(tokenizer):
    installed()

    class Own(Manager):
        def detokenize_logprob_tokens(self, vals, ids, decode_to_text):
            return [("own", i) for i in ids]

    own = object.__new__(Own)
    own.tokenizer = tokenizer
    assert own.detokenize_top_logprobs_tokens([[-1.0]], [[4]], True) == [[("own", 4)]]


def test_the_install_check_refuses_a_replacement_that_differs(monkeypatch):
    """The check's cases tell a replacement that drops the texts' order
    apart from the release: it is left stock, with the difference."""
    real = runtime.make_top

    def reversed_texts(original, release_one, texts_for=runtime.texts_of, on_answer=None):
        def backwards(tok):
            texts = texts_for(tok)
            return None if texts is None else (lambda ids: (texts(ids) or [])[::-1])

        return real(original, release_one, backwards, on_answer)

    monkeypatch.setattr(front_end, "make_top", reversed_texts)
    report = flatgather.sglang.install()
    assert vars(Manager)[runtime.TOP] is STOCK_TOP
    note = next(n for n in report.notes if runtime.TOP in n)
    assert "left stock" in note and "expected" in note
