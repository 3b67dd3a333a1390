"""The one exception flatgather raises for bad input.

Pure Python and import-light: the extension raises this very class (it
imports it by name), and the ``FLATGATHER_SGLANG`` switch can name it without
loading torch or the extension.
"""

__all__ = ["KINDS", "PlanError"]

KINDS = frozenset(
    {
        # From the plan builder (the Rust core).
        "length_mismatch",
        "empty_batch",
        "not_an_integer",
        "negative",
        "zero_extend",
        "start_past_extend",
        "too_many_tokens",
        "too_few_rows",
        "row_mismatch",
        "plan_too_large",
        "buffer_too_small",
        "bad_shape",
        "token_id_out_of_range",
        "left_to_release",
        # From the Python boundary ("bad_buffer" from the core too: gathered
        # values that are not the plan's count).
        "bad_container",
        "bad_argument",
        "bad_buffer",
        "bad_tensor",
    }
)


class PlanError(ValueError):
    """Bad batch metadata or arguments: the message names the request and the
    values.

    ``kind`` is a short, stable name of the error (one of :data:`KINDS`) and
    ``request`` the index of the request it is about, or None when it is not
    about one request.
    """

    kind: str
    request: int | None

    def __init__(self, message: str, kind: str, request: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.request = request

    def __reduce__(self):
        # Pickled across SGLang's process boundaries with every field.
        return (type(self), (str(self), self.kind, self.request))
