"""install() / uninstall(): the probe decides, nothing wrong is ever patched,
and uninstall() restores the exact original objects."""

from __future__ import annotations

import functools
import sys
import warnings

import flatgather.sglang as fs
import pytest
import torch
from _sglang import (
    PRUNES_AUX,
    ROW,
    STOCK_FORWARD,
    STOCK_HIDDEN_TO_STORE,
    STOCK_PRUNED_STATES,
    LogitsProcessor,
    lp,
)
from flatgather.sglang import installer, releases, shapes
from flatgather.sglang.patches import draft_prefill, front_end, output_logprobs
from flatgather.sglang.patches.openai_logprobs import runtime as openai_runtime
from flatgather.sglang.patches.pruned_states import probe


def current():
    return vars(LogitsProcessor)["_get_pruned_states"]


@pytest.mark.matrix
def test_the_probe_finds_the_table_row_true_of_the_running_release():
    verdict = probe.run(lp)
    contract = verdict.contract
    assert (
        contract.trailing_token_to_seq,
        contract.packed_aux,
        contract.writes_cpu_indices,
        contract.prunes_aux,
    ) == (ROW.trailing_token_to_seq, ROW.packed_aux, ROW.writes_cpu_indices, ROW.prunes_aux)
    assert verdict.lazy_aux, verdict.lazy_aux_note
    assert verdict.cases >= 30


@pytest.mark.matrix
def test_install_reports_what_it_verified_and_applied():
    report = fs.install()
    assert report.release == ROW.version
    assert report.verified_by == "probe and test matrix"
    assert report.lazy_aux
    assert ("aux-logprob-prune" in report.backports) is not PRUNES_AUX
    # The draft worker's and the scheduler's too, if another test imported their modules.
    assert set(report.backports) <= {
        "aux-logprob-prune",
        "draft-prefill-no-logprob",
        "prefill-skip-logprob-pt",
    }
    assert report.probe_seconds > 0
    ours = {
        f"{lp.__name__}.LogitsProcessor.{name}"
        for name in ("_get_pruned_states", "_get_hidden_states_to_store", "forward")
    }
    # The token-id input logprobs, where the release's callers look them up.
    chunk_module = sys.modules.get("sglang.srt.layers.logprob_processor", lp)
    ours.add(f"{chunk_module.__name__}.get_token_ids_logprobs_chunk")
    if hasattr(lp, "get_token_ids_logprobs_prefill"):
        ours.add(f"{lp.__name__}.get_token_ids_logprobs_prefill")
    assert ours <= set(report.patched)
    # Anything else is the draft worker's, the scheduler's, the front end's or
    # the OpenAI layer's,
    # patched now if another test imported its module, or the output-logprob
    # chain's (its producers and consumers).
    chain = (
        "get_top_logprobs",
        "get_token_ids_logprobs",
        *output_logprobs.CONSUMER_CLASSES.values(),
    )
    assert all(
        where.endswith((f".{draft_prefill.METHOD}", ".process_batch_result_prefill"))
        or any(name in where for name in chain)
        or where.startswith(f"{front_end.MODULES[0]}.{front_end.OWNER}.detokenize_")
        or where.endswith(f".{openai_runtime.NAME}")
        for where in set(report.patched) - ours
    ), report.patched


@pytest.mark.matrix
def test_install_is_idempotent_and_uninstall_restores_the_original_objects():
    before = dict(vars(LogitsProcessor))
    assert not fs.is_installed()
    first = fs.install()
    patched = current()
    assert fs.install() == first and current() is patched
    assert fs.is_installed()
    assert fs.uninstall() is True
    assert dict(vars(LogitsProcessor)) == before
    assert current() is STOCK_PRUNED_STATES
    assert vars(LogitsProcessor)["forward"] is STOCK_FORWARD
    assert vars(LogitsProcessor)["_get_hidden_states_to_store"] is STOCK_HIDDEN_TO_STORE
    assert fs.uninstall() is False
    assert not fs.is_installed()
    for _ in range(5):
        fs.install()
        fs.uninstall()
    assert dict(vars(LogitsProcessor)) == before
    assert fs.installed_report() is None


def test_uninstall_leaves_a_later_patch_by_someone_else_and_warns():
    fs.install()
    ours = vars(LogitsProcessor)["_get_pruned_states"]

    def theirs(self, *args):
        return ours(self, *args)

    LogitsProcessor._get_pruned_states = theirs  # another library patches after flatgather
    try:
        with pytest.warns(RuntimeWarning, match="_get_pruned_states was replaced"):
            assert fs.uninstall() is True
        assert vars(LogitsProcessor)["_get_pruned_states"] is theirs
        assert vars(LogitsProcessor)["forward"] is STOCK_FORWARD  # the others restored
        assert not fs.is_installed()
    finally:
        LogitsProcessor._get_pruned_states = STOCK_PRUNED_STATES


def test_uninstall_restores_without_a_word_where_nobody_else_patched():
    fs.install()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fs.uninstall() is True
    assert vars(LogitsProcessor)["_get_pruned_states"] is STOCK_PRUNED_STATES


def _wrap_release(monkeypatch, change):
    """Replace the release's function by one whose result ``change`` alters:
    a release flatgather has not seen."""

    @functools.wraps(STOCK_PRUNED_STATES)
    def altered(self, hidden, before, aux, md):
        result = STOCK_PRUNED_STATES(self, hidden, before, aux, md)
        if result[3] is not None:  # the logprob branch: the only one with sample indices
            result = change(list(result), md)
        return tuple(result)

    monkeypatch.setattr(LogitsProcessor, "_get_pruned_states", altered)
    return altered


def _shift_sample(result, md):
    result[3] = result[3] + 1
    return result


def _append_zero(result, md):
    result[5] = [*result[5], 0]
    return result


def _append_last(result, md):
    result[5] = [*result[5], len(md.extend_seq_lens_cpu) - 1]
    return result


@pytest.mark.matrix
@pytest.mark.parametrize(
    ("change", "field"), [(_shift_sample, "sample_indices"), (_append_zero, "token_to_seq_idx")]
)
def test_a_release_no_contract_fits_is_refused_and_left_untouched(monkeypatch, change, field):
    altered = _wrap_release(monkeypatch, change)
    before = dict(vars(LogitsProcessor))
    with pytest.raises(fs.UnsupportedRelease) as info:
        fs.install()
    message = str(info.value)
    assert field in message and "Nothing was patched" in message
    assert "expected" in message and "got" in message
    assert dict(vars(LogitsProcessor)) == before and current() is altered
    assert not fs.is_installed()


@pytest.mark.skipif(ROW.trailing_token_to_seq, reason="the release has the trailing entry")
def test_a_changed_release_that_a_contract_fits_is_refused_as_code_never_run(monkeypatch):
    """Appending the last request's index is the older releases' contract:
    the probe finds it and verifies it on its batches, but the code is none
    the test matrix has run (shapes.py), so nothing is patched."""
    altered = _wrap_release(monkeypatch, _append_last)
    assert probe.run(sys.modules[LogitsProcessor.__module__]).contract.trailing_token_to_seq
    with pytest.raises(fs.UnsupportedRelease) as info:
        fs.install()
    assert "not code flatgather has seen" in str(info.value)
    assert current() is altered and not fs.is_installed()


def test_a_release_outside_the_table_is_verified_by_the_probe_alone(monkeypatch):
    monkeypatch.setattr(installer, "sglang_release", lambda: "0.5.99")
    report = fs.install()
    assert report.release == "0.5.99" and report.verified_by == "probe"
    assert any("not in flatgather's test matrix" in note for note in report.notes)


@pytest.mark.parametrize("verified", [True, False])
def test_a_release_outside_the_table_prunes_aux_lazily_only_where_the_probe_verified_it(
    monkeypatch, verified
):
    monkeypatch.setattr(installer, "sglang_release", lambda: "0.5.99")
    if not verified:
        # A forward whose aux flow the probe cannot read off its bytecode.
        @functools.wraps(STOCK_FORWARD)
        def forward(self, *args, **kwargs):
            return STOCK_FORWARD(self, *args, **kwargs)

        monkeypatch.setattr(LogitsProcessor, "forward", forward)
    report = fs.install()
    assert report.verified_by == "probe" and report.lazy_aux is verified
    assert any(p.endswith("LogitsProcessor.forward") for p in report.patched) is verified
    assert any("lazy aux pruning left off" in note for note in report.notes) is not verified


@pytest.mark.matrix
def test_the_probe_builds_its_metadata_with_the_release_own_constructor(monkeypatch):
    """A release whose logprob branch depends on a field that only its own
    ``LogitsMetadata.from_forward_batch`` fills (here: shifts the sampled
    rows where ``top_logprobs_nums`` is set, as it is in every real batch)
    is refused: the probe saw the metadata the release builds."""

    def shift_where_built_by_the_release(result, md):
        return _shift_sample(result, md) if md.top_logprobs_nums is not None else result

    assert probe.run(lp).metadata_note == ""  # the release's constructor runs on this host
    _wrap_release(monkeypatch, shift_where_built_by_the_release)
    with pytest.raises(fs.UnsupportedRelease, match="sample_indices"):
        fs.install()


def test_force_is_accepted_changes_nothing_and_says_so():
    with pytest.warns(DeprecationWarning, match="no longer needed"):
        forced = fs.install(force=True)
    fs.uninstall()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = fs.install()
    assert forced.contract == plain.contract and forced.patched == plain.patched


def test_lazy_aux_stays_off_when_the_release_forward_uses_the_aux_result_elsewhere():
    def forward(self, hidden, aux):
        _pruned, _before, aux_pruned, _sample, _lp_idx, _t2s = self._get_pruned_states(hidden)
        stored = self._get_hidden_states_to_store(aux_pruned)
        return stored, aux_pruned  # read a second time: a lazy object would leak

    assert probe.aux_flow_problem(forward) == (
        "forward uses aux_pruned 3 times, not once stored and once passed on"
    )
    assert probe.aux_flow_problem(STOCK_FORWARD) is None


def any_store_is_known(monkeypatch):
    """The checks of the store that follow, on their own: the known-code
    gate (shapes.py), which refuses every store but the releases', answers
    yes to a store a test wraps (it is tested in test_mutation.py)."""
    known = shapes.known

    def store_known(where, owner, name):
        if where == shapes.STORE:
            return "any"
        return known(where, owner, name)

    monkeypatch.setattr(shapes, "known", store_known)


@pytest.mark.matrix
def test_full_capture_stays_eager_where_the_release_full_store_reads_the_pruned_aux(monkeypatch):
    """A release whose FULL store touches ``aux_pruned_states`` (here: only
    asks for its length) must keep every kept aux row gathered under FULL."""
    reads = []

    @functools.wraps(STOCK_HIDDEN_TO_STORE)
    def reading(self, hidden, before, aux, pruned, pruned_before, aux_pruned, sample, md):
        if md.capture_hidden_mode.is_full() and aux_pruned is not None:
            reads.append(len(aux_pruned) if isinstance(aux_pruned, list) else aux_pruned.shape)
        return STOCK_HIDDEN_TO_STORE(
            self, hidden, before, aux, pruned, pruned_before, aux_pruned, sample, md
        )

    monkeypatch.setattr(LogitsProcessor, "_get_hidden_states_to_store", reading)
    any_store_is_known(monkeypatch)
    report = fs.install()
    assert report.lazy_aux and not report.lazy_full
    assert any("FULL store reads the pruned aux layers" in note for note in report.notes)
    assert reads  # the probe ran it on real pruned layers after the sentinel failed


def test_detected_release_is_the_one_on_sys_path():
    import importlib.metadata

    assert releases.sglang_release() == ROW.version
    assert ROW.version in fs.SUPPORTED_RELEASES
    assert importlib.metadata.version("sglang") == ROW.version


def test_probe_results_do_not_depend_on_cuda_being_initialised():
    fs.install()
    assert not torch.cuda.is_initialized()


def _store_with_a_parameter_more(seen):
    """A release's store that takes one parameter more than the 0.5.x ones."""

    def store(
        self,
        hidden_states,
        hidden_states_before_norm,
        aux_hidden_states,
        pruned_states,
        pruned_states_before_norm,
        aux_pruned_states,
        sample_indices,
        logits_metadata,
        extra=None,
    ):
        if extra is not None:
            seen.append((aux_pruned_states, sample_indices, extra))
            return "stored"
        return STOCK_HIDDEN_TO_STORE(
            self,
            hidden_states,
            hidden_states_before_norm,
            aux_hidden_states,
            pruned_states,
            pruned_states_before_norm,
            aux_pruned_states,
            sample_indices,
            logits_metadata,
        )

    return store


def test_a_store_with_a_parameter_more_gets_every_argument_through(monkeypatch):
    """A release whose ``_get_hidden_states_to_store`` takes one more
    parameter: flatgather's store hands every argument on as it came (it
    used to spell out the 0.5.x parameters and raise a TypeError)."""
    seen = []
    release_store = _store_with_a_parameter_more(seen)
    monkeypatch.setattr(LogitsProcessor, "_get_hidden_states_to_store", release_store)
    any_store_is_known(monkeypatch)
    report = fs.install()
    assert report.lazy_aux
    patched = vars(LogitsProcessor)["_get_hidden_states_to_store"]
    assert patched is not release_store
    assert patched(None, *range(8), "positional") == "stored"
    assert patched(None, *range(8), extra="keyword") == "stored"
    assert seen == [(5, 6, "positional"), (5, 6, "keyword")]


def test_lazy_aux_stays_off_where_the_store_lacks_a_parameter_it_reads(monkeypatch):
    def store(
        self,
        hidden_states,
        hidden_states_before_norm,
        aux_hidden_states,
        pruned_states,
        pruned_states_before_norm,
        aux_pruned_states,
        rows,  # sample_indices, under another name
        logits_metadata,
    ):
        return STOCK_HIDDEN_TO_STORE(
            self,
            hidden_states,
            hidden_states_before_norm,
            aux_hidden_states,
            pruned_states,
            pruned_states_before_norm,
            aux_pruned_states,
            rows,
            logits_metadata,
        )

    monkeypatch.setattr(LogitsProcessor, "_get_hidden_states_to_store", store)
    report = fs.install()
    assert not report.lazy_aux
    assert any("no parameter sample_indices" in note for note in report.notes)
