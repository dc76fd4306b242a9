"""The convert stage: CSV to Parquet, one layout and codec per run; its local and Ray
engines share the CSV reader (`csvread`)."""
