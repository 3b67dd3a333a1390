"""What the tests and the bench need to run SGLang's own code beside
flatgather's in one process; nothing here is for serving.

- :func:`module_functions_as_shipped`: within it, the module-level functions
  ``install()`` replaced are the release's own again (the bench's stock side,
  the tests' oracle).
- :func:`install_sgl_kernel_stand_in`: makes the GPU-only ``sgl_kernel``
  importable, with functions that refuse to run, so that modules that import
  it (the draft worker of 0.5.10 to 0.5.12) load on a CPU.
"""

from __future__ import annotations

from flatgather.testing.standins import install_sgl_kernel_stand_in

__all__ = ["install_sgl_kernel_stand_in", "module_functions_as_shipped"]


def module_functions_as_shipped():
    """Within it (a context manager), the module-level functions that
    :func:`flatgather.sglang.install` replaced are the release's own again.
    Every thread sees the swap; it holds the install lock throughout, so
    that no ``install()`` or ``uninstall()`` interleaves with it."""
    from flatgather.sglang.installer import module_functions_as_shipped

    return module_functions_as_shipped()
