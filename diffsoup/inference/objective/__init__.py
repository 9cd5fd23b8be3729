"""The objective: per-experiment terms, the inference problem, and its lowering into compiled,
chunked programs (``ds.lower``) whose partial results combine."""
