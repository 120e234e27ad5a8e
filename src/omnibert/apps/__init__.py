"""The Hydra apps (console scripts), wiring only: ``omnibert-prepare``
(:mod:`~omnibert.apps.prepare`), ``omnibert-train`` (:mod:`~omnibert.apps.train`) and
``omnibert-export`` (:mod:`~omnibert.apps.export`)."""
