"""The PySpark cost pipeline: `cost report` prices a traffic ledger, `cost simulate` prices routing policies.

Modules: `session` (SparkSession and progress line), `readers` (ledger -> DataFrames), `transforms` (pure
DataFrame transforms), `prices`, `report` (report job shell), `html_report`, `topology` (simulator inputs,
policies, closed form), `simulate` (simulator job shell), `submit` (spark-submit entry).
"""
