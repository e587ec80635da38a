"""Stage 5, report: the analysis as blocks (headings, paragraphs, tables, plots) rendered to report.md and
report.html, with summary.csv beside them."""
