"""The HTML report: one self-contained `report.html` per run folder.

    from caprecon.htmlreport import write_html_report
    write_html_report("runs/a")        # -> runs/a/report.html, runs/a/report_files/

The page opens from file:// with no server and no network: styles and script are inline
(the script allowed by its hash in the page's Content-Security-Policy), images are JPEG
thumbnails in `report_files/thumbs/`, and the gallery is drawn page by page in the
browser from a JSON blob, so ten thousand samples load as fast as ten. Every text that
comes from data (captions, answers, ids, file names) reaches the page escaped, and
secrets in the manifest and in row errors are redacted (`caprecon.core.redaction`) before they are shown.

`score`, `meta`, `caption`, `cttd build` and `caprecon report` call `write_html_report`
at the end of a run; any command that writes a run folder can do the same.
"""

from caprecon.reports.html.page import write_html_report

__all__ = ["write_html_report"]
