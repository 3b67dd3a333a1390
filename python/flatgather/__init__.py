"""flatgather: one-pass gather plans for SGLang's logprob prefill.

SGLang's ``LogitsProcessor._get_pruned_states`` keeps, for every request of a
prefill batch that asks for input logprobs, the rows from its logprob start to
its end, and builds the sample / input-logprob / token-to-sequence indices in
Python loops. flatgather computes all of those index sets in one pass in Rust
and gathers every tensor with one ``index_select``.

>>> import flatgather
>>> plan = flatgather.prune_plan([4, 5, 6], [0, 5, 3])
>>> plan.gather.tolist()
[0, 1, 2, 3, 8, 12, 13, 14]
>>> plan.sample.tolist(), plan.num_pruned
([3, 4, 7], 8)

``flatgather.sglang.install()`` puts the same plan under SGLang itself.
"""

from flatgather._core import MAX_TOKENS, PlanError
from flatgather._plan import PrunePlan, prune_plan

__version__ = "0.1.0"

__all__ = ["MAX_TOKENS", "PlanError", "PrunePlan", "__version__", "prune_plan"]
