"""What a dataset says about lengths: token counts, percentiles and the limits they suggest."""

__all__ = ["lengths", "records"]
