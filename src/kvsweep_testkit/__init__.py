"""Fixtures the tests and the scripts share: models built for a test, local MLflow servers and Chromium, the
real pretrained model. kvsweep itself never imports this package (an import contract keeps it so); seams that
must ride into Ray workers stay in `kvsweep.testing`."""
