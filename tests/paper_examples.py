"""The worked examples of Xiao & Xiong's papers, shared by the tests that check against them."""

#: "Online query answering", eq. (10): the query matrix of the running example's history.
RUNNING_H = [
    [0, 1, 0, 0, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 1, 1],
    [0, 0, 0, 0, 4, 2, 0, 0, 0],
    [0, 0, 0, 0, 2, 0, 0, 0, 0],
    [0, 0, 0, 0, 1, 1, 0, -1, -1],
    [0, 1, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 2, 0, 0, 0],
]
#: Eq. (11): the budgets of its rows, as decimal strings so that ``Fraction(a)`` is exact.
RUNNING_ALPHA = ("0.05", "0.1", "0.05", "0.1", "0.1", "0.05", "0.05")
#: Eq. (14): the running query, x5 + x6.
RUNNING_Q = [0, 0, 0, 0, 1, 1, 0, 0, 0]
