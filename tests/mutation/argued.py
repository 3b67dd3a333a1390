"""Mutants that no input the suite tries tells apart from the release, and
why none can: equivalent (the edit changes no answer of the function), or
unreachable on a CPU (the edit changes only what a CUDA device runs).

Each rule names the function, the operator and the edited code (the
mutant's description without its line number, which moves between
releases), so one rule covers every release whose code is the same; an
argument goes in docs/reliability.md ("Mutants no input tells apart").
A mutant that no rule names and no input tells apart is counted
unexplained: the suite's inputs are short of it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

from .mutants import Mutant

EQUIVALENT = "equivalent"
CPU = "unreachable on a CPU"
OUTSIDE = "outside the oracle"
"""Not equivalent, and reachable on a CPU, but in code whose effect the
suite's harness for the function does not observe (a collaborator it leaves
inert): counted apart, a limit of the oracle, not an argument of sameness."""


@dataclass(frozen=True)
class Rule:
    function: str
    kind: str
    why: str
    operator: str | None = None
    """The mutant's operator (any, if None)."""
    code: str = ".*"
    """A regular expression the description (its line number dropped) must
    match in full."""
    lines: Callable[[ast.FunctionDef], Callable[[int], bool] | None] | None = None
    """Where given: which lines of the function (found in its tree) the rule
    holds for, every edit there."""
    through: tuple[str, ...] = ()
    """Where given: the rule holds only for a helper judged through one of
    these callers (:attr:`targets.Target.through`)."""


def _draft_stop(tree: ast.FunctionDef) -> Callable[[int], bool] | None:
    """The first statement after ``ForwardBatch.init_new`` that reads the
    forward batch or runs the draft model: the draft harness stops there
    (the draft model's forward needs the model, on its device)."""

    def reads_batch(node: ast.AST) -> bool:
        return any(
            (
                isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Load)
                and ast.unparse(n.value) == "forward_batch"
            )
            or (isinstance(n, ast.Call) and ast.unparse(n.func).endswith("draft_runner.forward"))
            for n in ast.walk(node)
        )

    made = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("ForwardBatch.init_new")
    ]
    if not made:
        return None
    stops = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.stmt)
        and n.lineno > made[0]
        and not isinstance(n, (ast.If, ast.With, ast.For))
        and reads_batch(n)
    ]
    if not stops:
        return None
    return lambda line: line >= min(stops)


_PREFILL_INERT = (
    r".*(token_to_kv_pool_allocator|output_streamer|stream_output|can_run_cuda_graph"
    r"|prefill_stats|metrics|copy_done|auxiliary_output|auxiliary_host_output"
    r"|routed_experts|indexer|sampling_mask|statuses|status = |_validate_pp_skip|hidden"
    r"|time_stats|grammar|embedding|pooled|phs|kv_cache|tree_cache|kv\.|hisparse|get_memory"
    r"|discard_finish_reason|discard_output_reason|should_commit_output|skip_stream_req"
    r"|update_finish_state|inflight_middle_chunks|to_finish|decoding_reqs|is_retracted"
    r"|finished\(\)|enable_overlap|disaggregation|is_generation|beam_coordinator"
    r"|reasoning|customized_info|_maybe_|init_next_round_input|cache_unfinished_req"
    r"|session|spec_|check_finished|free_group|release_|abort).*"
)


def _statements(pattern: str) -> Callable[[ast.FunctionDef], Callable[[int], bool]]:
    """The lines of the simple statements (and of the headers of compound
    ones) whose code matches ``pattern``: an edit of an expression there
    changes only what that statement does."""

    def lines(tree: ast.FunctionDef) -> Callable[[int], bool]:
        found = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.stmt) or node is tree:
                continue
            if isinstance(node, (ast.If, ast.While)):
                code, span = ast.unparse(node.test), range(node.lineno, node.body[0].lineno)
            elif isinstance(node, ast.For):
                code = f"for {ast.unparse(node.target)} in {ast.unparse(node.iter)}"
                span = range(node.lineno, node.body[0].lineno)
            elif isinstance(node, (ast.With, ast.Try, ast.FunctionDef, ast.ClassDef)):
                continue
            else:
                code, span = ast.unparse(node), range(node.lineno, node.end_lineno + 1)
            if re.fullmatch(pattern, code, re.S):
                found.update(span)
        return found.__contains__

    return lines


def _branches(*tests: str) -> Callable[[ast.FunctionDef], Callable[[int], bool]]:
    """The lines of the final ``else`` of an ``if`` whose test is one of
    ``tests``: a kind of batch the harness does not drive."""

    def lines(tree: ast.FunctionDef) -> Callable[[int], bool]:
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) in tests and node.orelse:
                if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
                    continue
                found.update(range(node.orelse[0].lineno, node.orelse[-1].end_lineno + 1))
        return found.__contains__

    return lines


def _embedding_branch(tree: ast.FunctionDef) -> Callable[[int], bool] | None:
    """The lines of the ``else`` branch of ``if self.is_generation:`` (an
    embedding model's batch), which the prefill harness never runs."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and ast.unparse(node.test) == "self.is_generation"
            and node.orelse
        ):
            first, last = node.orelse[0].lineno, node.orelse[-1].end_lineno
            return lambda line: first <= line <= last
    return None


def _within(kind: str, code: str) -> Callable[[ast.FunctionDef], Callable[[int], bool]]:
    """The lines of the body of an ``if`` whose test is ``code``
    (``kind="if"``), or of the ``except`` clauses of a ``try`` whose body
    holds a statement whose code is ``code`` (``kind="except"``)."""

    def lines(tree: ast.FunctionDef) -> Callable[[int], bool]:
        found = set()
        for node in ast.walk(tree):
            if kind == "if" and isinstance(node, ast.If) and ast.unparse(node.test) == code:
                found.update(range(node.body[0].lineno, node.body[-1].end_lineno + 1))
            if (
                kind == "except"
                and isinstance(node, ast.Try)
                and any(ast.unparse(b) == code for b in node.body)
            ):
                for handler in node.handlers:
                    found.update(range(handler.lineno, handler.end_lineno + 1))
        return found.__contains__

    return lines


def _last_range(tree: ast.FunctionDef) -> Callable[[int], bool] | None:
    """The line of the last ``range`` of the byte decoder's first list of
    printable bytes (``®`` to ``ÿ``)."""
    ranges = [
        n.lineno
        for n in ast.walk(tree.body[0])
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "range"
    ]
    if not isinstance(tree.body[0], ast.Assign) or not ranges:
        return None
    last = max(ranges)
    return lambda line: line == last


RULES: tuple[Rule, ...] = (
    Rule(
        "_draft_extend_for_prefill",
        CPU,
        "the edit lies after the first read of the forward batch or the draft model's forward, "
        "where the draft harness stops (the draft model runs on its device, with its weights); "
        "flatgather's rewrite leaves that code as shipped",
        lines=_draft_stop,
    ),
    Rule(
        "_draft_extend_for_prefill",
        EQUIVALENT,
        "the assertion holds on every batch (the extend lengths sum to the batch's tokens)",
        code=r"`assert pt == batch\.input_ids\.numel\(\)`",
    ),
    Rule(
        "_draft_extend_for_prefill",
        EQUIVALENT,
        "run twice, it writes the same values again (a copy into rows it does not read, or a "
        "rebinding to what it was bound to, or a second forward batch that replaces the first: "
        "nothing holds the first)",
        operator="statement duplicated",
        code=r"`(new_input_ids\[.*\.copy_\(|rotated_mm\[.*\.copy_\(|if mm_input_embeds is not "
        r"None:|tail_tokens = _eagle_prefill_tail_tokens\(|forward_batch = ForwardBatch\."
        r"init_new\().*`",
    ),
    Rule(
        "_draft_extend_for_prefill",
        OUTSIDE,
        "the draft harness's `ForwardBatch.init_new` records what is set on the forward batch, "
        "not the arguments it is called with nor `batch.spec_info`; flatgather's rewrite "
        "leaves these lines as shipped",
        code=r"`(batch\.spec_info = |ForwardBatch\.init_new\(|EagleDraftExtendInput\(|1`|False`)"
        r".*",
    ),
    Rule(
        "detokenize_logprob_tokens",
        EQUIVALENT,
        "run twice, the test returns from the first, or is false both times; the texts decoded "
        "again are the same texts (the tokenizer's decode reads nothing but the ids)",
        operator="statement duplicated",
        code=r"`(if not decode_to_text:|token_texts = self\.tokenizer\.batch_decode\().*`",
    ),
    Rule(
        "to_openai_style_logprobs",
        EQUIVALENT,
        "a nested function defined twice is the same function; a second empty `LogProbs()` "
        "replaces the first before anything is appended to it; a text made lossless again is "
        "the same text (`_lossless_token_text` returns a text without U+FFFD as it is, and its "
        "latin-1 rendering of a fragment holds none)",
        operator="statement duplicated",
        code=r"`(def append_token_logprobs\(|def append_top_logprobs\(|ret_logprobs = LogProbs\(\)"
        r"|token_text = _lossless_token_text\().*`",
    ),
    Rule(
        "_lossless_token_text",
        EQUIVALENT,
        "run twice: a test that returns where it holds is false again where it was (nothing "
        "between changes what it reads); the byte helpers give a tokenizer and an id the same "
        "bytes again (their caches spare work, not answers); bytes that fail UTF-8 fail it "
        "again; the first `try` returns, or passes over that failure, which its copy meets "
        "again; the second returns (latin-1 decodes any bytes)",
        operator="statement duplicated",
        code=r"`(if token_text is not None and '.' not in token_text:|if tokenizer is None or "
        r"token_id is None:|if raw is None:|raw = token_id_to_bytes\(tokenizer, token_id\)|"
        r"bytes\(raw\)\.decode\('utf-8'\)|try:)`",
    ),
    Rule(
        "_lossless_token_text",
        EQUIVALENT,
        "without a tokenizer or an id the byte helpers answer None (an object with no "
        "vocabulary fails the byte-level probe, which answers False; an id the tokenizer "
        "cannot convert raises, which they catch), and the function falls back to the text "
        "that test returns: dropping the test or its return, or asking for both, changes no "
        "answer",
        code=r"`(if tokenizer is None or token_id is None:|tokenizer is None or token_id is "
        r"None)`",
    ),
    Rule(
        "_lossless_token_text",
        EQUIVALENT,
        "the same: what the no-tokenizer test returns is the fallback the helpers lead to",
        operator="statement dropped",
        lines=_within("if", "tokenizer is None or token_id is None"),
    ),
    Rule(
        "_lossless_token_text",
        EQUIVALENT,
        "the branch is dead: latin-1 decodes any bytes",
        lines=_within("except", "return bytes(raw).decode('latin-1')"),
    ),
    Rule(
        "token_id_to_bytes",
        EQUIVALENT,
        "run twice: a test that returns (or builds the byte decoder) where it holds is false "
        "again where it was; a `global` declaration, a conversion of the same id, a lookup of "
        "the same character and an empty `bytearray` bound again change nothing; the probe "
        "answers a tokenizer the same again",
        operator="statement duplicated",
        code=r"`(if not _is_byte_level_tokenizer\(tokenizer\):|global _BYTE_DECODER|if not "
        r"_BYTE_DECODER:|_BYTE_DECODER = _build_byte_decoder\(\)|try:|if piece is None:|"
        r"piece = tokenizer\.convert_ids_to_tokens\(token_id\)|b = _BYTE_DECODER\.get\(ch\)|"
        r"if b is None:|if not out:|out = bytearray\(\))`",
    ),
    Rule(
        "token_id_to_bytes",
        EQUIVALENT,
        "an empty piece's bytes, `[]`, decode as UTF-8 to the empty text, so its one caller "
        "falls back to the same text as for None",
        operator="statement dropped",
        code=r"`if not out:`",
    ),
    Rule(
        "token_id_to_bytes",
        EQUIVALENT,
        "the same: the empty bytes go on to that caller instead of None",
        operator="statement dropped",
        code=r"`return None`",
        lines=_within("if", "not out"),
    ),
    Rule(
        "_build_byte_decoder",
        EQUIVALENT,
        "run twice, the loop over the bytes (or its test) finds every byte already listed "
        "after the first run, and appends nothing",
        operator="statement duplicated",
        code=r"`(for b in range\(2 \*\* 8\):|if b not in bs:)`",
    ),
    Rule(
        "_build_byte_decoder",
        EQUIVALENT,
        "the last printable range then takes in 256, whose character, chr(256), the loop "
        "gives next to byte 0: the dict keeps that later pair, and is the release's",
        operator="constant",
        code=r"`(1` -> 2|255` -> 256)",
        lines=_last_range,
    ),
    Rule(
        "_is_byte_level_tokenizer",
        EQUIVALENT,
        "the cache of byte-level tokenizers (by `id`) only spares the probe, which answers a "
        "live tokenizer the same each time: dropping or repeating a lookup, its return or an "
        "insertion changes no answer",
        code=r"`(if tid in _BYTE_LEVEL_TOKENIZERS:|if is_bl:|_BYTE_LEVEL_TOKENIZERS\.add\(tid\))`",
    ),
    Rule(
        "_is_byte_level_tokenizer",
        EQUIVALENT,
        "the same: the lookup's `return True` dropped leaves the probe to answer",
        code=r"`return True`",
        lines=_within("if", "tid in _BYTE_LEVEL_TOKENIZERS"),
    ),
    Rule(
        "_is_byte_level_tokenizer",
        EQUIVALENT,
        "run twice: a test that returns, continues or builds the decoder where it holds is "
        "false again where it was; the same id, flag, vocabulary size and piece are read "
        "again; the probe loop run again answers as the first run (which returns, or finds "
        "nothing); the `try`'s first run always returns",
        operator="statement duplicated",
        code=r"`(tid = id\(tokenizer\)|is_bl = getattr\(tokenizer, 'is_byte_level', None\)|"
        r"if isinstance\(is_bl, bool\):|global _BYTE_DECODER|if not _BYTE_DECODER:|"
        r"_BYTE_DECODER = _build_byte_decoder\(\)|try:|vocab_size = len\(tokenizer\."
        r"get_vocab\(\)\)|for sid in sample_ids:|if sid < 0 or sid >= vocab_size:|piece = "
        r"tokenizer\.convert_ids_to_tokens\(sid\)|if piece is None or not piece:|if any\(\(ch "
        r"not in _BYTE_DECODER for ch in piece\)\):)`",
    ),
    Rule(
        "_is_byte_level_tokenizer",
        EQUIVALENT,
        "its one caller reads the answer as `not ...`: the None returned instead of False "
        "reads alike",
        operator="statement dropped",
        code=r"`return False`",
        lines=_within("except", "vocab_size = len(tokenizer.get_vocab())"),
    ),
    Rule(
        "_is_byte_level_tokenizer",
        EQUIVALENT,
        "`and` for `or`: a None piece still skips (None and True), and an empty one goes on to "
        "a test over none of its characters, which skips it as well",
        operator="boolean",
        code=r"`piece is None or not piece`",
    ),
    *(
        Rule(
            raw,
            OUTSIDE,
            "the prefill branch: the producer the suite judges it through passes "
            "`LogprobStage.DECODE`, and flatgather replaces only that producer; the logits "
            "processor's own calls of the prefill stage run this code as shipped (up to 0.5.15 "
            "the token-id one through `get_token_ids_logprobs_prefill`, judged apart)",
            lines=_branches("stage == LogprobStage.DECODE"),
            through=("get_top_logprobs", "get_token_ids_logprobs"),
        )
        for raw in ("get_top_logprobs_raw", "get_token_ids_logprobs_raw")
    ),
    Rule(
        "get_token_ids_logprobs_raw",
        OUTSIDE,
        "the decode branch: `get_token_ids_logprobs_prefill` passes `LogprobStage.PREFILL`; "
        "the same edits are judged through the producer `get_token_ids_logprobs`, which runs "
        "that branch",
        lines=_within("if", "stage == LogprobStage.DECODE"),
        through=("get_token_ids_logprobs_prefill",),
    ),
    Rule(
        "get_token_ids_logprobs_chunk",
        EQUIVALENT,
        "`min` and `max` of two integers are the same whichever comes first",
        operator="arguments swapped",
        code=r"`(min\(pruned_len, max\(|max\()logprobs\.shape\[0\] - pt, 0\)\)?`",
    ),
    Rule(
        "get_token_ids_logprobs_chunk",
        EQUIVALENT,
        "a request of no rows past the test appends an empty entry and moves the cursor by "
        "none, as the test's own branch does; the only one it would treat otherwise is a "
        "first request continued with no rows left, which the caller never passes (it "
        "continues a chunk's first request only while rows of it remain: the rows already "
        "done, returned by the chunk before, are fewer than its rows)",
        operator="comparison",
        code=r"`pruned_len <= 0` -> Lt",
    ),
    Rule(
        "get_top_logprobs_raw",
        EQUIVALENT,
        "the same top-k of the same logprobs, bound again",
        operator="statement duplicated",
        code=r"`values, indices = logprobs\.topk\(max_k, dim=-1\)`",
    ),
    Rule(
        "get_token_ids_logprobs_raw",
        EQUIVALENT,
        "run twice: the same pinning answer, the same id tensor, a new empty row again (its "
        "first is held by nothing), and a test for no ids that is false once its body made "
        "them an empty list",
        operator="statement duplicated",
        code=r"`(pin_memory = is_pin_memory_available\(logprobs\.device\)|if token_ids is None:|"
        r"row = logprobs\.new_empty\(\(0,\)\)|token_ids_tensor = torch\.tensor\(token_ids, "
        r"dtype=torch\.lo.*)`",
    ),
    Rule(
        "get_token_ids_logprobs_raw",
        CPU,
        "`non_blocking` of the ids' copy to the logprobs' device: on a CPU there is no copy",
        operator="constant",
        code=r"`True` -> False",
        lines=_statements(r"token_ids_tensor = torch\.tensor\(.*non_blocking=True\)"),
    ),
    Rule(
        "_get_pruned_states",
        EQUIVALENT,
        "the assertion holds on every batch whose logprob start lies within its request "
        "(a start past the request is no batch a scheduler makes)",
        code=r"`assert extend_len > start_len`",
    ),
    Rule(
        "_get_pruned_states",
        EQUIVALENT,
        "a tensor made of a tensor holds the same values, dtype and device",
        operator="statement duplicated",
        code=r"`(\w+) = torch\.tensor\(\1, .*",
    ),
    Rule(
        "_get_hidden_states_to_store",
        EQUIVALENT,
        "the branch is dead: every capture mode that needs a capture is FULL or LAST",
        code=r"`(assert False, 'Should never reach'|False)`.*",
    ),
    Rule(
        "_get_hidden_states_to_store",
        EQUIVALENT,
        "`pack_aux_hidden_states` returns a tensor as it is: packing twice packs once, and "
        "it is the only name the branch binds from one it binds",
        operator="statement duplicated",
        code=r"`(\w+ = pack_aux_hidden_states\(.*|if logits_metadata\.capture_hidden_mode\."
        r"is_last\(\):|if aux_hidden_states is not None:)`?",
    ),
    Rule(
        "_normalize_decode_outputs",
        OUTSIDE,
        "the chain's harness drives the method with a plain decode batch that asks for "
        "logprobs (what `flatgather.bench.spec_chain` runs), never a spec-v2 or a spec-v1 "
        "batch nor one without logprobs; the rewrite replaces only the `.tolist()` loops and "
        "leaves these lines as shipped",
        code=r".*(_resolve_spec_v2_tokens|spec_algorithm|is_spec_v2|next_token_logprobs = None"
        r"|\[\[t\] for t in ids\]|isinstance\(next_token_ids, list\)).*",
    ),
    Rule(
        "copy_to_cpu",
        CPU,
        "every statement of the method makes a host copy of a device tensor (or records the "
        "copy's event, or maps the copy over a holder's tensors); on a CPU the copy holds the "
        "values its source holds, so an edit that drops, repeats or skips a copy changes only "
        "where the values live and when they are copied, which no CPU run can show "
        "(`tests/test_spec_logprobs.py` compares the device branch where CUDA is present)",
    ),
    Rule(
        "process_batch_result_prefill",
        EQUIVALENT,
        "the assertion holds on every batch that reaches it",
        code=r"`assert (logits_output|extend_input_len_per_req) is not None`",
    ),
    Rule(
        "process_batch_result_prefill",
        OUTSIDE,
        "the edit lies in the embedding model's branch (`else` of `if self.is_generation:`), "
        "which the prefill harness, a generation model's batch, never runs",
        lines=_embedding_branch,
    ),
    Rule(
        "process_batch_result_prefill",
        OUTSIDE,
        "the prefill harness hands the method no next-token token-id logprobs, so their "
        "`.tolist()` has nothing to convert",
        code=r"`logits_output\.next_token_token_ids_logprobs_val = \[v\.toli.*",
    ),
    Rule(
        "process_batch_result_decode",
        OUTSIDE,
        "the number of accepted tokens feeds the KV and acceptance bookkeeping, which the "
        "decode harness leaves inert (it observes each request's tokens and logprobs)",
        code=r"`new_accepted_len = .*",
    ),
    Rule(
        "process_batch_result_decode",
        OUTSIDE,
        "the edit lies in the spec-v1 path (a speculative batch that is not spec v2), which the "
        "decode harness (plain decode and spec v2, as the chain runs them) never drives",
        lines=_branches("batch.spec_algorithm.is_none() or batch.is_spec_v2", "batch.is_spec_v2"),
    ),
    Rule(
        "process_batch_result_prefill",
        OUTSIDE,
        "the edit changes only what a statement on an inert collaborator does (see below)",
        lines=_statements(_PREFILL_INERT),
    ),
    Rule(
        "process_batch_result_decode",
        OUTSIDE,
        "the edit changes only what a statement on an inert collaborator does (see below)",
        lines=_statements(_PREFILL_INERT),
    ),
    Rule(
        "_draft_extend_for_prefill",
        EQUIVALENT,
        "the rotation loop run a second time starts where the first ended: every slice it "
        "writes is empty (a one-element tensor broadcast into none)",
        operator="statement duplicated",
        code=r"`for i, extend_len in enumerate\(batch\.extend_seq_lens\):`",
    ),
    Rule(
        "process_batch_result_prefill",
        OUTSIDE,
        "the edit changes only calls on, or values of, what the prefill harness leaves inert "
        "(the KV pool, the streamer, metrics and time stats, grammar, hidden states, auxiliary "
        "and routed-expert outputs, sampling masks, finishing and discarding, embeddings); the "
        "harness observes each request's logprob state, and flatgather's fix leaves these "
        "lines as shipped",
        code=_PREFILL_INERT,
    ),
    Rule(
        "process_batch_result_decode",
        OUTSIDE,
        "the edit changes only calls on, or values of, what the decode harness leaves inert "
        "(metrics, grammar, streaming, the KV cache, finishing, hidden states); the harness "
        "observes what each request receives of its tokens and logprobs, and the chain's "
        "rewrite leaves these lines as shipped",
        code=_PREFILL_INERT,
    ),
)


def _code(description: str) -> str:
    return re.sub(r"^line \d+: ", "", description)


def _line(description: str) -> int:
    found = re.match(r"^line (\d+): ", description)
    return int(found.group(1)) if found else 0


IDEMPOTENT = (
    "the statement run twice leaves what it leaves run once: it only binds names or "
    "attributes, from values that read none of them, through calls without side effects"
)
LEAVES = (
    "run twice, a test without side effects whose body ends by leaving (`return`, `break`, "
    "`continue`, `raise`) leaves where it holds, and is false again where it was not: the "
    "copy never runs its body"
)


def leaves(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` is an ``if`` without ``else`` whose test is
    :func:`_pure` and whose body ends in ``return``, ``break``, ``continue``
    or ``raise``: a copy of it right after it changes nothing."""
    return (
        isinstance(stmt, ast.If)
        and not stmt.orelse
        and _pure(stmt.test)
        and isinstance(stmt.body[-1], (ast.Return, ast.Break, ast.Continue, ast.Raise))
    )


def argued(
    function: str, mutant: Mutant, tree: ast.FunctionDef | None = None, through: str | None = None
) -> str:
    """``"<kind>: <why>"`` for a duplicated statement that is idempotent
    (:func:`idempotent`, given the function's ``tree``) or for the first
    rule naming ``mutant`` of ``function`` (judged through the caller
    ``through``, if any); else empty."""
    if tree is not None and mutant.operator == "statement duplicated":
        field, position = mutant.variant
        stmt = getattr(list(ast.walk(tree))[mutant.site], field)[position]
        if idempotent([stmt]):
            return f"{EQUIVALENT}: {IDEMPOTENT}"
        if leaves(stmt):
            return f"{EQUIVALENT}: {LEAVES}"
    code = _code(mutant.description)
    for rule in RULES:
        if rule.function != function or rule.operator not in (None, mutant.operator):
            continue
        if rule.through and through not in rule.through:
            continue
        if not re.fullmatch(rule.code, code, re.S):
            continue
        if rule.lines is not None:
            where = rule.lines(tree) if tree is not None else None
            if where is None or not where(_line(mutant.description)):
                continue
        return f"{rule.kind}: {rule.why}"
    return ""


# Calls taken to have no side effect: builtins that build or test a value,
# torch's functions (each returns a new tensor or a value), and the methods
# that read a tensor or a mode (``is_*``) without writing anything.
_PURE_BUILTINS = frozenset(
    {
        *("isinstance", "len", "list", "tuple", "range", "sum", "min", "max", "bool", "int"),
        *("float", "ord", "chr", "id", "bytes", "bytearray"),
    }
)
_PURE_METHODS = frozenset(
    {"tolist", "clone", "size", "dim", "item", "view", "reshape", "contiguous", "flatten", "cpu"}
)


def _path(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes (or subscripts) on a name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        base = _path(node.value)
        if base is None:
            return None
        return f"{base}.{node.attr}" if isinstance(node, ast.Attribute) else base
    return None


def _pure_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in _PURE_BUILTINS
    if isinstance(func, ast.Attribute):
        if _path(func) is not None and _path(func).startswith("torch."):
            return True
        return func.attr in _PURE_METHODS or func.attr.startswith("is_")
    return False


def _pure(node: ast.AST) -> bool:
    """No call with a side effect, no assignment expression, no await/yield."""
    for sub in ast.walk(node):
        if isinstance(sub, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda)):
            return False
        if isinstance(sub, ast.Call) and not _pure_call(sub):
            return False
    return True


def _reads(node: ast.AST) -> set[str]:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(
            getattr(sub, "ctx", None), ast.Load
        ):
            path = _path(sub)
            if path is not None:
                found.add(path)
    return found


def _binds(stmt: ast.stmt) -> set[str] | None:
    """What ``stmt`` binds (None: it does something else)."""
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        found = set()
        for target in targets:
            names = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            for name in names:
                if isinstance(name, ast.Subscript) and not _pure(name.slice):
                    return None
                path = _path(name)
                if path is None:
                    return None
                found.add(path)
        return found
    if isinstance(stmt, ast.If):
        inner = [_binds(s) for s in [*stmt.body, *stmt.orelse]]
        return None if None in inner else set().union(*inner)
    if isinstance(stmt, (ast.Assert, ast.Pass, ast.Expr)):
        return set()
    return None


def _clash(reads: set[str], binds: set[str]) -> bool:
    return any(
        r == b or r.startswith(b + ".") or b.startswith(r + ".") for r in reads for b in binds
    )


def idempotent(block: list[ast.stmt]) -> bool:
    """Whether running ``block`` twice in a row leaves what running it once
    leaves: each statement binds names or attributes (or asserts, or tests
    and does the same), its values and tests are :func:`_pure`, and no
    statement reads what it or a later statement of the block binds."""
    for k, stmt in enumerate(block):
        later = [_binds(s) for s in block[k:]]
        if None in later:
            return False
        if isinstance(stmt, ast.If):
            if not _pure(stmt.test) or not idempotent(stmt.body) or not idempotent(stmt.orelse):
                return False
            reads = _reads(stmt.test)
        else:
            value = getattr(stmt, "value", None) or getattr(stmt, "test", None)
            if isinstance(stmt, ast.Assert) and stmt.msg is not None and not _pure(stmt.msg):
                return False
            if value is not None and not _pure(value):
                return False
            reads = _reads(value) if value is not None else set()
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Subscript):
                            reads |= _reads(sub.slice)
        if _clash(reads, set().union(*later)):
            return False
    return True
