"""The tools: omnibert-eval, omnibert-predict (fill-mask too), omnibert-export, model cards."""
