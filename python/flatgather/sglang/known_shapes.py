"""The fingerprints of the code flatgather vouches for, and the releases that
have each (see :mod:`flatgather.sglang.shapes`).

Generated: do not edit. After adding a release to the release table, or a
patch that declares code it vouches for, regenerate it from every release's
own code:

    .venv/bin/python -m flatgather.testing.fingerprints --write
"""

KNOWN: dict[str, dict[str, tuple[str, ...]]] = {
    "LogitsProcessor._get_pruned_states": {
        "176dd0d10863d3f3": ("0.5.10", "0.5.10.post1"),
        "1927b0e1ad82eff8": ("0.5.11",),
        "4d6e2a86a79cf7ae": ("0.5.12", "0.5.12.post1"),
        "a0bb0a2ed1a07c6b": ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"),
        "bc0eafae8733caf3": ("0.5.16",),
        "0b3189cb6dcbaf64": ("0.5.17", "0.5.18", "0.5.19"),
        "ce4f949c5a384117": ("0.5.20",),
        "e5cec2d16f4bfc72": ("0.5.21", "0.5.22", "0.5.23"),
    },
    "LogitsProcessor._get_hidden_states_to_store": {
        "650c3950fca03bdb": (
            "0.5.10",
            "0.5.10.post1",
            "0.5.11",
            "0.5.12",
            "0.5.12.post1",
            "0.5.13",
            "0.5.13.post1",
            "0.5.14",
            "0.5.15",
            "0.5.15.post1",
            "0.5.16",
        ),
        "a4bc88c2b1e9d910": ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
    },
    "get_token_ids_logprobs_chunk": {
        "1628077b99c13580": (
            "0.5.10",
            "0.5.10.post1",
            "0.5.11",
            "0.5.12",
            "0.5.12.post1",
            "0.5.13",
            "0.5.13.post1",
            "0.5.14",
            "0.5.15",
            "0.5.15.post1",
        ),
        "80053495b1b363bd": ("0.5.16", "0.5.17"),
        "9ab78ee97687c556": ("0.5.18", "0.5.19", "0.5.20"),
        "a2bcafead576fc38": ("0.5.21", "0.5.22", "0.5.23"),
    },
    "get_token_ids_logprobs_prefill": {
        "2d59906fbf6d1d21": (
            "0.5.10",
            "0.5.10.post1",
            "0.5.11",
            "0.5.12",
            "0.5.12.post1",
            "0.5.13",
            "0.5.13.post1",
            "0.5.14",
            "0.5.15",
            "0.5.15.post1",
        ),
    },
    "get_top_logprobs": {
        "7ba89b35641ff649": (
            "0.5.10",
            "0.5.10.post1",
            "0.5.11",
            "0.5.12",
            "0.5.12.post1",
            "0.5.13",
            "0.5.13.post1",
            "0.5.14",
            "0.5.15",
            "0.5.15.post1",
            "0.5.16",
            "0.5.17",
            "0.5.18",
            "0.5.19",
            "0.5.20",
            "0.5.21",
            "0.5.22",
            "0.5.23",
        ),
    },
    "get_token_ids_logprobs": {
        "14b7aa7cc9273ea2": (
            "0.5.10",
            "0.5.10.post1",
            "0.5.11",
            "0.5.12",
            "0.5.12.post1",
            "0.5.13",
            "0.5.13.post1",
            "0.5.14",
            "0.5.15",
            "0.5.15.post1",
        ),
        "4057f850e07f45c9": ("0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20"),
        "369fba85bf118961": ("0.5.21", "0.5.22", "0.5.23"),
    },
    "GenerationBatchResult._async_d2h": {
        "2378479a2a26e13c": (
            "0.5.15",
            "0.5.15.post1",
            "0.5.16",
            "0.5.17",
            "0.5.18",
            "0.5.19",
            "0.5.20",
        ),
        "bbd1a2aa5314e9c3": ("0.5.21", "0.5.22"),
        "a228f14f049024fc": ("0.5.23",),
    },
}
