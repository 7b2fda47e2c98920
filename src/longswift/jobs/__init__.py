"""The jobs layer: what a job is, what a long run keeps on disk, and what it plans before it starts.

Modules: `request` (`GenerationRequest`: the prompt and every setting of one generation), `state` (the job
checkpoint: everything needed to continue a run), `batch` (one resumable job per prompt of a JSONL file) and
`memory` (the memory plan of a job, checked before any weight is loaded). No model, no decoder: plain data, files
and arithmetic.
"""
