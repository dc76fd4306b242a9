"""Stage `report`: the results page, its charts and the plot data, rendered from files.

`render` renders and writes (the stage); `data` reads and checks the metrics, `tables`
writes markdown, `charts` the chart rows, specs and SVG, `blocks` fills the marked blocks of
a page.
"""
