from llamafast.cli import app

app()
