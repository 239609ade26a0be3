"""Reports over a sweep: tables, plots and statistics, written as Markdown, HTML and CSV."""
