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

#: "Bayesian inference under DP", eqs. (11)-(12): the 8 x 4 example's query matrix ...
EIGHT_BY_FOUR_H = [
    [1, 1, 0, 0],
    [0, 0, 1, 1],
    [0, 0, 0, 1],
    [0, 0, 1, 0],
    [0, 1, 0, 1],
    [2, 1, 0, 0],
    [0, 0, 2, -1],
    [0, -1, 0, 1],
]
#: ... the budgets of its rows (decimal strings, exact as ``Fraction(a)``) ...
EIGHT_BY_FOUR_ALPHA = ("0.05", "0.1", "0.05", "0.1", "0.1", "0.05", "0.05", "0.1")
#: ... and eq. (14): their noisy answers.
EIGHT_BY_FOUR_Y = (30.8, 30.3, 46.9, 20.2, 30.4, 68.9, 38.9, 9.5)

#: Sec. 4.2 / 5.2: the query x1 + x3 of that example, its BLUE weights over the 8 rows (eq. 26,
#: as printed, to two places) and its estimate, 42; sec. 5.2 asks for Pr(theta > 0) there.
EIGHT_BY_FOUR_THETA_WEIGHTS = (0.48, 0.36, -0.03, 0.50, -0.50, 0.26, 0.07, 0.24)
EIGHT_BY_FOUR_THETA_ESTIMATE = 42.0
#: Sec. 5.2: Pr(theta > 0) for that query, exact under eq. (26)'s weights, to two places. The
#: paper prints 0.88 (and the 95% interval [-41, 125]), from a law wider than those weights give
#: (docs/probabilistic.md, "The papers' example"); 0.96 is what they give, and what the paper's
#: own binned method (its Alg. 2) computes from them.
EIGHT_BY_FOUR_PR_THETA_POSITIVE = 0.96
