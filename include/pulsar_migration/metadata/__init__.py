"""Step 1, metadata sync: inventory both clusters, plan (Spark), apply, verify."""
