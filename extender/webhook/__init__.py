"""The admission webhook (DESIGN §2, §5 step 1, §5a rule 3): pure decisions on AdmissionReview
requests (`review`, `patch`, `admission`) and the thin aiohttp handler and command (`app`,
`cli`) that carry them over HTTPS."""
