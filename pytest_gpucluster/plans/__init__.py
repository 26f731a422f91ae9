"""What each acceptance area launches: a profile section becomes the `harness.Part` s its tests need.

Pure: no pytest, no torch, no launching (the harness launches, `checks/` judges what came back).
"""
