"""Multiple shooting's window starts: computed once per experiment (``prepare_windows``) and
kept in a window cache shared by processes (``DIFFSOUP_CACHE_DIR``)."""
