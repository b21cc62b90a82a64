"""python -m helpers.data: get the data and say which was used."""

from helpers.data.source import main

main()
