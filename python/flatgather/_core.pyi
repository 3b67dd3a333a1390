"""Type stubs of the extension ``flatgather._core`` (checked against the
built module by ``mypy.stubtest`` in ``.ci/test``)."""

from typing import Any, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_PLAN_BYTES",
    "MAX_TOKENS",
    "PrunePlan",
    "RotationPlan",
    "TokenIdsPlan",
    "__version__",
]

MAX_TOKENS: int
MAX_PLAN_BYTES: int
__version__: str

@final
class PrunePlan:
    def __new__(
        cls,
        extend_seq_lens: Any,
        extend_logprob_start_lens: Any,
        num_rows: Any = None,
        exact_rows: bool = False,
    ) -> PrunePlan: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_pruned(self) -> int: ...
    @property
    def num_input_logprob(self) -> int: ...
    def buffer_len(self, token_to_seq: bool = True) -> int: ...
    def fill(self, out: npt.NDArray[np.int64], token_to_seq: bool = True) -> None: ...
    def sample_list(self) -> list[int]: ...
    def input_logprob_list(self) -> list[int]: ...
    def token_to_seq_list(self, trailing: bool = False) -> list[int]: ...

@final
class RotationPlan:
    def __new__(cls, extend_lens: Any, num_rows: Any = None) -> RotationPlan: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    def buffer_len(self, embeds: bool = False) -> int: ...
    def fill(self, out: npt.NDArray[np.int64], embeds: bool = False) -> None: ...

@final
class TokenIdsPlan:
    def __new__(
        cls,
        pruned_lens: Any,
        token_ids: Any,
        vocab: int,
        rows: int,
        split: int = 0,
        skip_empty: bool = False,
        whole: bool = False,
    ) -> TokenIdsPlan: ...
    @property
    def num_values(self) -> int: ...
    @property
    def next_split(self) -> int: ...
    @property
    def extends(self) -> bool: ...
    def buffer_len(self, rows: bool = False) -> int: ...
    def fill(self, out: npt.NDArray[np.int64], rows: bool = False) -> None: ...
    def entries(self) -> list[tuple[int, int, int, int, bool] | None]: ...
    def nest(
        self, values: list[Any], token_ids: list[Any], val_out: list[Any], idx_out: list[Any]
    ) -> None: ...
