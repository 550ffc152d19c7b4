"""The namespace the state-by-value tests save and bring back: a 100 MB frame, a fitted
model whose class a cell defined, a lambda (by value) and an open file (named as lost).
One definition, for the service's save/restore tests and the kernel's simulated reboot."""

NOTEBOOK = """
import numpy as np, pandas as pd
rng = np.random.default_rng(7)
df = pd.DataFrame(rng.standard_normal((1_310_720, 10)), columns=[f"c{i}" for i in range(10)])
class LeastSquares:
    def fit(self, X, y):
        self.coef_ = np.linalg.lstsq(X, y, rcond=None)[0]
        return self
    def predict(self, X):
        return X @ self.coef_
model = LeastSquares().fit(df[["c0", "c1"]].to_numpy()[:1000], df["c2"].to_numpy()[:1000])
scale = lambda v: v * 3 + 1
log = open("/workspace/log.txt", "w")
expected = (round(float(df.to_numpy().sum()), 6), model.predict(np.array([[1.0, 2.0]])).tolist(), scale(2))
"""

# True when the frame, the model and the lambda came back; the open file did not.
CHECK = ("(round(float(df.to_numpy().sum()), 6), model.predict(np.array([[1.0, 2.0]])).tolist(), scale(2)) "
         "== expected, type(model).__name__, df.shape, 'log' in dir()")
BACK = "(True, 'LeastSquares', (1310720, 10), False)"
