"""The task and its text: multiplication problems and levels (:mod:`~dsh.task.problems`), long multiplication and
its checks (:mod:`~dsh.task.arithmetic`), SFT traces (:mod:`~dsh.task.traces`), chat records
(:mod:`~dsh.task.records`), the response parser (:mod:`~dsh.task.parse`), responses from a known two-stage process
(:mod:`~dsh.task.synthetic`), verl export (:mod:`~dsh.task.verl`) and the laptop task (:mod:`~dsh.task.laptop_task`).
Imports only the layers below (core, theory)."""
