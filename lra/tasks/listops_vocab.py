"""ListOps' fixed names: the vocabulary (:mod:`lra.tasks.listops` tokenises with it, :mod:`lra.tasks.listops_check`
evaluates trees over it: 0 = pad, 1 = unknown, then the digits, the operators and ``X``, the closing ``]``) and the
optional fourth split's name. No torch here: the report and the dashboard import these."""

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
VOCAB = ("<pad>", "<unk>", *map(str, range(10)), *OPERATORS, "X")
TOKEN_IDS = {token: i for i, token in enumerate(VOCAB)}
INDEPENDENT_TEST = "independent_test"  # basic_independent_test.tsv, drawn after the official splits
