"""The fetch stage: each file from its sources.yaml mirrors, checked against its pinned digest."""
