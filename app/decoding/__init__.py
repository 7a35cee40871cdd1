"""Round loops: the plan, the loop builder, and the classic and block verify loops."""
