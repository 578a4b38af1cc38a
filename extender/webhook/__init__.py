"""The admission webhook: pure decisions on AdmissionReview requests (`review` the envelope,
`pods` reading a pod, `admission` mutation, `validation` and `access` what is refused, `patch`
the JSONPatch, `certs` a certificate's expiry) and the thin aiohttp handler, metrics and command
(`app`, `metrics`, `cli`) that carry them over HTTPS."""
