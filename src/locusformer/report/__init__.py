"""Self-contained HTML reports: sections, figures, the attention diagram, templates."""
