"""CI relay: upstream GitHub webhooks in, downstream dispatches out, results back."""
