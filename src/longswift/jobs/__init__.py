"""The jobs layer: what a long run keeps on disk and plans before it starts.

Modules: `state` (the job checkpoint: everything needed to continue a run), `batch` (one resumable job per prompt
of a JSONL file) and `memory` (the memory plan of a job, checked before any weight is loaded).
These are plain data and files: no model, no decoder.
"""
